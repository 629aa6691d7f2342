"""Convertible nodes: one pool of machines, each a sampler or the trainer, converted as S1 says.

Instead of a trainer machine of its own that the scheduler starts and stops, a
:class:`NodePool` turns one of its samplers into the trainer when S1 starts the trainer, and
back when S1 stops it (:class:`ConvertingTrainer` is the scheduler's lifecycle over a pool).
The calls to the :class:`~rllm_core.ports.NodeConverter` come in a fixed order, documented
there.

Which node becomes the trainer: first the hard conditions. A node's :class:`NodeClass` says
whether it is a spot machine and which precision it runs. Spot nodes never train (a reclaimed
machine would take the rounds trained since the last cut with it), nor do nodes whose
precision can only sample (``fp8``, ``int8``, ``int4``: training needs ``bf16``, ``fp16`` or
``fp32``). The pool never converts its last sampler, since sampling would stop and the trainer
would wait for nothing; with ``only_class`` set, nodes of other classes never convert. Of the
nodes left, the one with the largest ``capacity`` converts (the trainer holds the weights,
gradients and optimizer state, more than a sampler); between equal capacities, the one with
the least work in flight (fewer requests to wait for or cut); then the pool's order.

Trajectories in flight on a node that converts: the node first stops taking new ones, then
waits up to ``grace_s`` for those in flight. Those that finish in time are kept and trained
like any other; those still running are cut: they never reach the sample buffer and are never
trained (their tasks are rolled out again elsewhere). A trajectory is never trained half-done.

A conversion that fails halfway (the trainer cannot start, or cannot write its cut) returns
the node to sampling before the error goes on to the scheduler, which counts the incarnation
as failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rllm_core.errors import RllmError
from rllm_core.ports import NodeConverter, StopTrigger

__all__ = [
    "TRAINING_PRECISIONS",
    "Conversion",
    "ConversionError",
    "ConvertingTrainer",
    "Node",
    "NodeClass",
    "NodePool",
    "Role",
]

TRAINING_PRECISIONS = frozenset({"bf16", "fp16", "fp32"})
"""The precisions a node must run to train; any other samples only."""

Role = Literal["sampler", "trainer"]


@dataclass(frozen=True)
class NodeClass:
    """A kind of machine in the pool: its name, whether it is a spot (reclaimable) machine,
    the precision its accelerator runs the policy in, and its capacity (any unit the pool
    shares; the largest converts first)."""

    name: str
    spot: bool = False
    precision: str = "bf16"
    capacity: float = 1.0

    def trainer_refusal(self) -> str | None:
        """Why a node of this class may not become the trainer; None when it may."""
        if self.spot:
            return (
                f"node class {self.name!r} is spot: a reclaimed machine would take the rounds"
                " trained since the last cut with it"
            )
        if self.precision not in TRAINING_PRECISIONS:
            return (
                f"node class {self.name!r} runs {self.precision}, which samples but cannot"
                f" train (training needs one of {', '.join(sorted(TRAINING_PRECISIONS))})"
            )
        return None

    @property
    def can_train(self) -> bool:
        return self.trainer_refusal() is None


@dataclass
class Node:
    """One machine of the pool and its current role."""

    name: str
    node_class: NodeClass
    role: Role = "sampler"


@dataclass(frozen=True)
class Conversion:
    """One conversion: the node, the role it took, the trajectories kept and cut on the way
    (sampler to trainer), the incarnation started or the trigger of the cut written, and the
    policy release loaded (trainer to sampler)."""

    node: str
    to: Role
    kept: int = 0
    cut: int = 0
    incarnation: int | None = None
    trigger: StopTrigger | None = None
    release: int | None = None


class ConversionError(RllmError):
    """No node may become the trainer, or the one asked for may not; the message says which
    rule refused it and what to change."""


@dataclass
class NodePool:
    """The pool's nodes (in preference order between equals, see the module docstring) and
    its converter. ``work`` returns the work in flight on each node when ranking them (none:
    no node has any); ``only_class`` limits the nodes that may convert to one class."""

    nodes: Sequence[Node]
    converter: NodeConverter
    grace_s: float = 30.0
    """How long a converting sampler waits for the trajectories in flight to finish."""
    work: Callable[[], Awaitable[Mapping[str, int]]] | None = None
    only_class: str | None = None
    conversions: list[Conversion] = field(default_factory=list)

    def __post_init__(self) -> None:
        names = [node.name for node in self.nodes]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"node pool names {', '.join(repeated)} more than once: rename them")
        if sum(node.role == "trainer" for node in self.nodes) > 1:
            raise ValueError("a node pool has at most one trainer node")
        classes = sorted({node.node_class.name for node in self.nodes})
        if self.only_class is not None and self.only_class not in classes:
            raise ConversionError(
                f"node class {self.only_class!r} has no node in the pool; its classes are"
                f" {', '.join(classes)}: name one of them, or leave the class to the pool"
            )

    @property
    def samplers(self) -> list[Node]:
        return [node for node in self.nodes if node.role == "sampler"]

    @property
    def trainer(self) -> Node | None:
        return next((node for node in self.nodes if node.role == "trainer"), None)

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ConversionError(
            f"no node named {name!r} in the pool; it has {', '.join(n.name for n in self.nodes)}"
        )

    def refusal(self, node: Node) -> str | None:
        """Why ``node`` may not become the trainer now; None when it may."""
        if node.role != "sampler":
            return f"node {node.name!r} is already the trainer"
        refused = node.node_class.trainer_refusal()
        if refused is not None:
            return f"node {node.name!r}: {refused}"
        if self.only_class is not None and node.node_class.name != self.only_class:
            return (
                f"node {node.name!r} is of class {node.node_class.name!r}, and only"
                f" {self.only_class!r} may train"
            )
        if len(self.samplers) <= 1:
            return (
                f"node {node.name!r} is the pool's last sampler: converting it would stop sampling"
            )
        return None

    def ranked(self, work: Mapping[str, int] | None = None) -> list[Node]:
        """The nodes that may become the trainer now, best first: largest capacity, then least
        ``work`` in flight, then the pool's order."""
        work = work or {}
        order = {node.name: index for index, node in enumerate(self.nodes)}
        allowed = [node for node in self.samplers if self.refusal(node) is None]
        return sorted(
            allowed,
            key=lambda node: (-node.node_class.capacity, work.get(node.name, 0), order[node.name]),
        )

    def candidate(self, work: Mapping[str, int] | None = None) -> Node:
        """The best node that may become the trainer now (:meth:`ranked`)."""
        if self.trainer is not None:
            raise ConversionError(
                f"node {self.trainer.name!r} is already the trainer; stop it before starting"
                " another"
            )
        ranked = self.ranked(work)
        if ranked:
            return ranked[0]
        refusals = [self.refusal(node) or "" for node in self.samplers]
        raise ConversionError(
            "no node of the pool may become the trainer ("
            + "; ".join(refusals or ["the pool has no sampler"])
            + "); add a non-spot node that trains in bf16, fp16 or fp32, or run the trainer on a"
            " node of its own"
        )

    async def to_trainer(self, incarnation: int, name: str | None = None) -> Conversion:
        """Convert ``name`` (else :meth:`candidate`) into trainer incarnation ``incarnation``."""
        if name is None:
            work = await self.work() if self.work is not None else None
            node = self.candidate(work)
        else:
            node = self.node(name)
        refused = self.refusal(node)
        if refused is not None:
            raise ConversionError(f"{refused}; choose another node or leave the choice to the pool")
        converter = self.converter
        await converter.stop_admitting(node.name)
        kept = await converter.collect_finished(node.name, self.grace_s)
        cut = await converter.cut_unfinished(node.name)
        await converter.release_sampler(node.name)
        node.role = "trainer"
        try:
            await converter.start_trainer(node.name, incarnation)
        except Exception:
            await self._resume_sampling(node)
            raise
        conversion = Conversion(
            node=node.name, to="trainer", kept=kept, cut=cut, incarnation=incarnation
        )
        self.conversions.append(conversion)
        return conversion

    async def train_round(self) -> bool:
        """One round on the trainer node; a trainer that fails goes back to sampling."""
        node = self._trainer()
        try:
            return await self.converter.train_round(node.name)
        except Exception:
            await self._resume_sampling(node)
            raise

    async def to_sampler(self, trigger: StopTrigger) -> Conversion:
        """Stop the trainer with a cut recording ``trigger`` and make its node a sampler."""
        node = self._trainer()
        try:
            await self.converter.stop_trainer(node.name, trigger)
        except Exception:
            await self._resume_sampling(node)
            raise
        release = await self._resume_sampling(node)
        conversion = Conversion(node=node.name, to="sampler", trigger=trigger, release=release)
        self.conversions.append(conversion)
        return conversion

    def _trainer(self) -> Node:
        node = self.trainer
        if node is None:
            raise ConversionError("no node of the pool is the trainer; start one first")
        return node

    async def _resume_sampling(self, node: Node) -> int:
        release = await self.converter.load_release(node.name)
        await self.converter.start_sampler(node.name)
        node.role = "sampler"
        return release


class ConvertingTrainer:
    """The scheduler's :class:`~rllm_core.ports.TrainerLifecycle` over a :class:`NodePool`:
    starting an incarnation converts a sampler, stopping it converts the node back. ``record``
    journals each conversion (a ``converted`` record: the :class:`Conversion`'s fields)."""

    def __init__(
        self,
        pool: NodePool,
        record: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.pool = pool
        self.record = record
        self.incarnation = 0

    async def _recorded(self, conversion: Conversion) -> None:
        if self.record is not None:
            fields = {k: v for k, v in asdict(conversion).items() if v is not None}
            await self.record({"kind": "converted", **fields, "incarnation": self.incarnation})

    async def start(self, incarnation: int) -> None:
        self.incarnation = incarnation
        await self._recorded(await self.pool.to_trainer(incarnation))

    async def train_round(self) -> bool:
        return await self.pool.train_round()

    async def stop(self, trigger: StopTrigger) -> None:
        await self._recorded(await self.pool.to_sampler(trigger))
