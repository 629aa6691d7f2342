"""The keys a run writes into a component's config: one table, declared by each plugin.

A run fills some keys of a component's config from the run itself (a store's folder inside the
run folder, the trainer's seed, the renderer's tokenizer). A plugin accepts such a key by
listing it in its spec's ``run_keys`` trait, and its config must have a field of that name
(:class:`~rllm_core.plugins.specs.ComponentSpec` refuses one that does not); the run writes
only the keys a spec lists, so a field that happens to share a name is left alone.

:data:`RUN_KEYS` is the table: for each kind, the keys a spec may list and what the run writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["RUN_KEYS", "run_key_choices"]

_STORE_PATH = "a folder of the run folder named after the section, when the plan sets none"

RUN_KEYS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "trace_store": {"path": _STORE_PATH},
        "sample_buffer": {
            "path": _STORE_PATH,
            "store": "the plan's built [object_store], for a buffer that lives in it",
            "prefix": "runs/<[run].name>/buffer with an [object_store], when the plan sets none",
        },
        "object_store": {"path": _STORE_PATH},
        "logger": {
            "path": "logs/<name> in the run folder, when the plan sets none and the field is"
            " required",
        },
        "sampler": {"weights_dir": "weights/ in the run folder, when the plan sets none"},
        "renderer": {
            "tokenizer": "the trainer's model folder, when the plan sets none and the model is"
            " on this machine",
        },
        "trainer_backend": {
            "seed": "[run].seed, when the plan sets none",
            "deterministic": "[run].deterministic (one switch for the whole run)",
            "logprob_temperature": "[sampling].temperature when above 0 (recomputed logprobs"
            " must match the sampler's)",
            "total_steps": "an SFT run's step count (its learning-rate schedule's length),"
            " when the plan sets none",
            "tokenizer": "[renderer].tokenizer, when the plan sets none",
        },
        "trainer_launcher": {
            "store": "the plan's built [object_store], where the launched job meets the scheduler",
        },
    }
)


def run_key_choices(kind: str) -> tuple[str, ...]:
    """The keys a spec of ``kind`` may list in ``run_keys``."""
    return tuple(RUN_KEYS.get(kind, {}))
