"""Per-rollout sampling seeds, so a run (and a resumed run) samples the same tokens.

The sampler draws from a request's ``seed`` when it has one. :class:`SeededGateway` hands the
rollout runner a view of the gateway whose ``configure_session`` adds a seed derived from the
run's seed and the session's :class:`~rllm_core.rollout.sessions.SessionKey` without its run
(step, task, rollout index, attempt): distinct for every rollout, identical in a resumed run,
and the same whatever the run is called. The rest is the gateway's.
"""

from __future__ import annotations

import hashlib

import msgspec

from rllm_core.rollout.gateway import SessionGateway
from rllm_core.rollout.sessions import SessionKey
from rllm_core.types import LLMEndpoint, SamplingParams

__all__ = ["SeededGateway", "session_seed"]


def session_seed(seed: int, key: SessionKey) -> int:
    """A 63-bit seed from the run's ``seed`` and ``key`` without its run."""
    return _hashed(seed, key.tail())


def _hashed(seed: int, text: str) -> int:
    digest = hashlib.sha256(f"{seed}|{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class SeededGateway:
    """A :class:`~rllm_core.rollout.gateway.SessionGateway` over ``gateway`` whose
    ``configure_session`` enforces ``enforced`` plus the session's seed.

    A session id that is not one of run ``run_id``'s (:meth:`SessionKey.parse` finds no key)
    is seeded from the whole id.
    """

    def __init__(self, gateway: SessionGateway, *, seed: int, run_id: str) -> None:
        self._gateway = gateway
        self._seed = seed
        self._run_id = run_id

    def configure_session(self, session_id: str, *, enforced: SamplingParams | None) -> None:
        params = enforced if enforced is not None else SamplingParams()
        key = SessionKey.parse(session_id, run=self._run_id)
        seed = _hashed(self._seed, key.tail() if key is not None else session_id)
        self._gateway.configure_session(
            session_id, enforced=msgspec.structs.replace(params, seed=seed)
        )

    def endpoint(self, session_id: str) -> LLMEndpoint:
        return self._gateway.endpoint(session_id)

    def denied(self, session_id: str) -> int:
        return self._gateway.denied(session_id)

    def release_session(self, session_id: str) -> None:
        self._gateway.release_session(session_id)
