"""Per-rollout sampling seeds, so a run (and a resumed run) samples the same tokens.

The sampler draws from a request's ``seed`` when it has one. :class:`SeededGateway` hands the
rollout runner a view of the gateway whose ``configure_session`` adds a seed derived from the
run's seed and the session id with the run id stripped (step, task, rollout index, attempt):
distinct for every rollout and identical in a resumed run. Everything else is the gateway's.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from rllm_core.types import SamplingParams

__all__ = ["SeededGateway", "session_seed"]


def session_seed(seed: int, run_id: str, session_id: str) -> int:
    """A 63-bit seed from the run's ``seed`` and ``session_id`` without its ``run_id`` head."""
    tail = session_id.removeprefix(run_id)
    digest = hashlib.sha256(f"{seed}|{tail}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class SeededGateway:
    """Delegates to ``gateway``; ``configure_session`` enforces ``enforced`` plus a seed."""

    def __init__(self, gateway: Any, *, seed: int, run_id: str) -> None:
        self._gateway = gateway
        self._seed = seed
        self._run_id = run_id

    def configure_session(self, session_id: str, *, enforced: SamplingParams | None) -> None:
        params = enforced if enforced is not None else SamplingParams()
        seeded = msgspec.structs.replace(
            params, seed=session_seed(self._seed, self._run_id, session_id)
        )
        self._gateway.configure_session(session_id, enforced=seeded)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gateway, name)
