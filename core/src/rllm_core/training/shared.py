"""A run's shared state in the plan's ``[object_store]``, where a sampler and a trainer meet.

Everything lives under ``runs/<[run].name>/`` of the store, so two processes started with the
same plan (``rllm-core run PLAN --role sampler`` and ``--role trainer``, on one machine over a
``file`` store or on several over ``s3``) find each other by the run's name:

- ``buffer/``: the sample buffer (``[sample_buffer]``, ``object-store`` unless the plan says
  otherwise, with this prefix);
- ``tickets/<step>``: one JSON object per rollout batch (a
  :class:`~rllm_core.training.pipeline.Ticket`: step, the sequences of its samples, its data
  order, its rollout metrics and episode records), written once its samples are in the buffer,
  so the trainer trains batch ``N`` as step ``N`` exactly as a one-process async run does;
- ``progress``: the trainer's last trained step and weight version (the sampler's gate);
- ``releases/``: the policy versions the trainer published (:mod:`rllm_core.run.cuts`);
- ``cuts/``: the trainer's checkpoint cuts;
- ``scheduler/``: the trainer scheduler's journal (:mod:`rllm_core.training.scheduler`).

A store that already holds a run of that name continues it: a sampler starts after its last
batch, a trainer restores its newest cut. Give a new run a new ``[run].name`` or an empty store.
"""

from __future__ import annotations

import json

from rllm_core.errors import ObjectNotFoundError
from rllm_core.ports import ObjectStore
from rllm_core.training.pipeline import Ticket

__all__ = ["SharedRun"]

_STEP_DIGITS = 10


class SharedRun:
    """The keys of one run in ``store``; see the module docstring."""

    def __init__(self, store: ObjectStore, name: str) -> None:
        self.store = store
        self.name = name
        self.prefix = f"runs/{name}"
        self._tickets: dict[int, Ticket] = {}

    def key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))

    # ------------------------------------------------------------------ tickets

    def _ticket_key(self, step: int) -> str:
        return self.key("tickets", f"{step:0{_STEP_DIGITS}d}")

    def put_ticket(self, ticket: Ticket) -> None:
        """Record batch ``ticket.step``; a second sampler that produced the same step loses
        (``ValueError`` naming it), since two batches cannot both be step ``N``."""
        data = json.dumps(ticket.to_dict(), separators=(",", ":")).encode()
        if not self.store.put_if_absent(self._ticket_key(ticket.step), data):
            raise ValueError(
                f"batch {ticket.step} of run {self.name!r} is already in the object store: another"
                " sampler produced it; run one sampler per run name"
            )
        self._tickets[ticket.step] = ticket

    def ticket(self, step: int) -> Ticket | None:
        """Batch ``step``, or None while no sampler has produced it."""
        if step in self._tickets:
            return self._tickets[step]
        try:
            data = self.store.get(self._ticket_key(step))
        except ObjectNotFoundError:
            return None
        ticket = Ticket.from_dict(json.loads(data))
        self._tickets[step] = ticket
        return ticket

    def last_step(self) -> int:
        """The highest step a sampler produced (0 when none)."""
        keys = self.store.list(self.key("tickets") + "/")
        return int(keys[-1].rsplit("/", 1)[1]) if keys else 0

    def tickets_after(self, step: int) -> list[Ticket]:
        """The batches after ``step`` in order, up to the first one not produced yet."""
        found: list[Ticket] = []
        while (ticket := self.ticket(step + len(found) + 1)) is not None:
            found.append(ticket)
        return found

    # ------------------------------------------------------------------ trainer progress

    def put_progress(self, step: int, version: int) -> None:
        """Record that the trainer finished ``step`` with weights at ``version``."""
        data = json.dumps({"step": step, "version": version}).encode()
        self.store.put(self.key("progress"), data)

    def progress(self) -> tuple[int, int]:
        """The trainer's last trained step and weight version (``(0, 0)`` before any)."""
        try:
            row = json.loads(self.store.get(self.key("progress")))
        except ObjectNotFoundError:
            return 0, 0
        return int(row["step"]), int(row["version"])

    def waiting_groups(self, step: int, batch_size: int) -> int:
        """Groups rolled out for the batches after ``step`` (``batch_size`` per batch, the
        groups the advantage estimator dropped included, so that a batch of zero-variance
        groups still counts as a batch)."""
        return batch_size * len(self.tickets_after(step))
