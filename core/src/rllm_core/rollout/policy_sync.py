"""Keeping a ``[sampler]`` (model servers) on the trainer's policy.

:class:`PolicySync` exports the trainer's current weights
(:meth:`~rllm_core.ports.WeightExporter.export_weights`) into the folder the sampler names for
that version (:meth:`~rllm_core.ports.PolicyFollower.export_path`), then waits until the
sampler serves them (:meth:`~rllm_core.ports.PolicyFollower.update_weights`). A run calls
:meth:`PolicySync.sync` before its first rollout and after every optimizer step; what either
side raises propagates unchanged, so the run fails with the sampler's own error (which names
the server).

Export folders the sampler has moved past are deleted, keeping the newest :data:`KEEP`: the
one it serves, and the one before for requests that started on it.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rllm_core.ports import PolicyFollower, WeightExporter
from rllm_core.types import ExportedWeights

__all__ = ["KEEP", "PolicySync", "SamplerMismatch", "check_policy_follower"]

KEEP = 2
"""Export folders kept: the served version and the one before."""


class SamplerMismatch(Exception):
    """A ``[sampler]`` that a run cannot keep on the policy: the sampler does not follow one,
    or the trainer cannot export its weights. The message names both and what to do."""


def check_policy_follower(
    sampler: Any, trainer: Any, *, sampler_name: str, trainer_name: str
) -> None:
    """Raise :class:`SamplerMismatch` unless ``sampler`` is a
    :class:`~rllm_core.ports.PolicyFollower` and ``trainer`` a
    :class:`~rllm_core.ports.WeightExporter`."""
    if not isinstance(sampler, PolicyFollower):
        raise SamplerMismatch(
            f"[sampler]: sampler {sampler_name!r} cannot be kept on the trainer's policy (it has"
            " no export_path / update_weights, rllm_core.ports.PolicyFollower), so its servers"
            " would sample from weights the run never trained; use a sampler that follows the"
            " policy, or remove [sampler] to sample from the trainer backend"
        )
    if not isinstance(trainer, WeightExporter):
        raise SamplerMismatch(
            f"[sampler]: sampler {sampler_name!r} needs weights exported by the trainer; trainer"
            f" backend {trainer_name!r} cannot export them (it has no export_weights); remove"
            " [sampler] or use a trainer backend that exports weights"
        )


async def _in_thread(call: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(call)


class PolicySync:
    """Keeps ``sampler`` on ``trainer``'s weights (a trainer backend that is a
    :class:`~rllm_core.ports.WeightExporter`); see the module docstring.

    ``call`` runs a trainer call where the run runs them (the loop's trainer thread; a worker
    thread by default).
    """

    def __init__(
        self,
        trainer: Any,
        sampler: PolicyFollower,
        *,
        call: Callable[[Callable[[], Any]], Awaitable[Any]] = _in_thread,
        keep: int = KEEP,
    ) -> None:
        self.trainer = trainer
        self.sampler = sampler
        self.call = call
        self.keep = max(1, keep)
        self.served: ExportedWeights | None = None
        """What the sampler serves since the last :meth:`sync`."""
        self.followers: list[Callable[[ExportedWeights], Awaitable[None]]] = []
        """Awaited after every update the sampler made, in order, before :meth:`sync` returns
        (a run's gateway workers are told the new policy this way)."""
        self._folders: list[str] = []

    async def sync(self) -> ExportedWeights:
        """Export the trainer's current version and make the sampler serve it; returns the
        export. A version already served is not exported again."""
        version = int(self.trainer.weight_version)
        if self.served is not None and self.served.version == version:
            return self.served
        path = self.sampler.export_path(version)
        exported: ExportedWeights = await self.call(lambda: self.trainer.export_weights(path))
        await self.sampler.update_weights(exported)
        self.served = exported
        for follower in self.followers:
            await follower(exported)
        self._forget_old(exported.path)
        return exported

    def _forget_old(self, path: str) -> None:
        if path in self._folders:
            self._folders.remove(path)
        self._folders.append(path)
        while len(self._folders) > self.keep:
            old = self._folders.pop(0)
            if old not in self._folders:
                shutil.rmtree(Path(old), ignore_errors=True)
