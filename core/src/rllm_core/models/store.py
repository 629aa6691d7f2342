"""Where pulled models live in the cache, whether they are complete, and what a model name or
path given by a user resolves to.

A catalog model ``<name>`` is cached in ``<cache>/models/<name>-<key>/``, where the key digests
the wheel pin, the file inside it, the dtype and the conversion recipe (:data:`RECIPE`), so
that changing any of them caches into a new folder. A folder counts as cached when its
``manifest.json`` exists and every file it lists has the recorded size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rllm_core.cache import cache_dir, folder_problem, read_manifest
from rllm_core.errors import ModelNotCachedError, ModelNotFoundError
from rllm_core.models.catalog import CATALOG, catalog_entry, known_models
from rllm_core.models.hub import hub_cache_dir, parse_hub_id, resolve_hub_id

__all__ = [
    "RECIPE",
    "ModelStatus",
    "model_dir",
    "model_status",
    "resolve_model",
    "resolve_tokenizer",
]

RECIPE = 1
"""The conversion recipe's version: raise it when the conversion output changes."""


def model_dir(name: str) -> Path:
    """The folder the known model ``name`` is (or will be) cached in; it may not exist.

    Raises :class:`ModelNotFoundError` for a name the catalog does not know.
    """
    entry = catalog_entry(name)
    return cache_dir() / "models" / f"{entry.name}-{entry.recipe_key(RECIPE)}"


@dataclass(frozen=True)
class ModelStatus:
    """Where a known model is cached and whether it is usable.

    ``state`` is ``cached`` (complete), ``missing`` (never pulled into this cache) or
    ``damaged`` (the folder exists but fails the manifest check; ``problem`` says how).
    ``size_bytes`` is the total size the manifest records, when cached.
    """

    name: str
    folder: Path
    state: Literal["cached", "missing", "damaged"]
    problem: str | None = None
    size_bytes: int | None = None


def model_status(name: str) -> ModelStatus:
    """The cache status of the known model ``name``, from its manifest (no weights are read)."""
    folder = model_dir(name)
    if not folder.exists():
        return ModelStatus(name, folder, "missing")
    problem = folder_problem(folder)
    if problem is not None:
        return ModelStatus(name, folder, "damaged", problem=problem)
    manifest = read_manifest(folder) or {}
    size = sum(entry["size"] for entry in manifest.get("files", {}).values())
    return ModelStatus(name, folder, "cached", size_bytes=size)


def resolve_model(name_or_path: str) -> Path:
    """The local model folder that ``name_or_path`` names, tried in this order:

    1. a known model name (see :data:`~rllm_core.models.catalog.CATALOG`) resolves to its
       cached folder; when it is not cached, or the cached folder is damaged,
       :class:`ModelNotCachedError` says to run ``rllm-core models pull <name>``;
    2. an existing folder (``~`` expanded; a plan has already made a relative one absolute
       against the plan's folder) resolves to itself when it holds ``config.json``;
    3. a Hugging Face Hub id (``owner/name`` or ``owner/name@revision``) resolves to its
       snapshot in the Hugging Face cache (:mod:`rllm_core.models.hub`); resolving never downloads;
       :class:`ModelNotCachedError` names the id, the cache and the command to run when it is
       not there.

    Anything else raises :class:`ModelNotFoundError` naming the value and the known models.
    """
    return _resolve(name_or_path, needs=("config.json",), what="model")


def resolve_tokenizer(name_or_path: str) -> Path:
    """The local folder holding the tokenizer ``name_or_path`` names, in the order of
    :func:`resolve_model`: a known model (its cached folder holds its tokenizer), an existing
    folder, then a Hub id in the Hugging Face cache whose snapshot holds ``tokenizer.json`` or
    ``tokenizer_config.json``. An existing folder is returned as it is: the tokenizer loader
    says which files it lacks."""
    return _resolve(name_or_path, needs=_TOKENIZER_FILES, what="tokenizer")


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _resolve(name_or_path: str, *, needs: tuple[str, ...], what: str) -> Path:
    if name_or_path in CATALOG:
        status = model_status(name_or_path)
        command = f"run: rllm-core models pull {name_or_path}"
        if status.state == "missing":
            raise ModelNotCachedError(
                f"model {name_or_path!r} is not cached (expected in {status.folder}); {command}",
                name=name_or_path,
                folder=str(status.folder),
            )
        if status.state == "damaged":
            raise ModelNotCachedError(
                f"the cached model {name_or_path!r} in {status.folder} is incomplete or damaged"
                f" ({status.problem}); {command}",
                name=name_or_path,
                folder=str(status.folder),
            )
        return status.folder
    folder = Path(name_or_path).expanduser()
    if what == "tokenizer" and folder.is_dir():
        return folder
    if (folder / "config.json").is_file():
        return folder
    known = known_models()
    if folder.is_dir():
        reason = f"the folder {str(folder)!r} has no config.json, so it holds no model"
    else:
        hub_id = parse_hub_id(name_or_path)
        if hub_id is not None:
            return resolve_hub_id(hub_id, needs=needs, what=what)
        reason = (
            f"{name_or_path!r} is neither a known model, an existing folder nor a Hugging Face"
            " Hub id (owner/name or owner/name@revision)"
        )
    raise ModelNotFoundError(
        f"{reason}; name a known model ({', '.join(known)}), a local Hugging Face {what}"
        f" folder{' (one with config.json)' if what == 'model' else ''} or a Hub id cached in"
        f" {hub_cache_dir()}",
        value=name_or_path,
        known=known,
    )
