"""Convertible nodes in a split run: the scheduler lends a sampling server's node to the trainer.

With ``[scheduler].nodes``, each node is the machine of one of the ``[sampler]``'s model
servers. The ``--role trainer`` process schedules (S1) over a
:class:`~rllm_core.training.nodes.NodePool` whose converter is a :class:`StoreNodeConverter`;
the ``--role sampler`` process, which owns the sampler and its server pool, runs a
:class:`NodeAgent` that carries out the sampler's half of each conversion. The two meet only in
the run's object store, under ``runs/<name>/nodes/``:

====================  =========  ==========================================================
key                   writer     content
====================  =========  ==========================================================
``<node>/<n>.ask``    scheduler  ``{"op", "ts", ...}``: request ``n`` (from 1) to the sampler
``<node>/<n>.answer`` sampler    ``{"result", "ts"}`` or ``{"error", "ts"}``: what it did
``work``              sampler    ``{"ts", "in_flight": {node: requests}}``, every ``poll_s``
====================  =========  ==========================================================

A conversion from sampler to trainer asks ``drain`` (the pool routes nothing new to the
node's server), ``collect`` (wait up to ``[scheduler].node_grace_s`` for its requests in
flight; the answer counts the requests that finished there since the drain), ``cut`` (the
requests still running are ended and sent again to the other servers, so no trajectory is
lost; the answer counts them) and ``release``; the scheduler then launches the trainer
incarnation through ``[scheduler].launcher`` with the node's name in its command file (a
launcher that places jobs on machines puts it there; ``local-process`` runs it on this one).
Back to sampling: the incarnation stops with a cut, then ``load`` (the sampler loads the
newest policy release and exports it to its servers; the answer is its weight version) and
``admit`` (the server takes requests again). Ranking uses ``work``: of the nodes that may
train, the one with the largest class capacity, then the fewest requests in flight.

The server keeps running while its node trains: freeing its accelerator memory (vLLM's sleep
mode, for one) is the engine's and not done here. A request the sampler does not answer within
``answer_timeout_s`` fails the conversion, which returns the node to sampling. A scheduler that
restarts first returns the nodes its predecessor left lent (:meth:`StoreNodeConverter.reclaim`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from rllm_core.errors import ObjectNotFoundError, RllmError
from rllm_core.ports import DrainablePool, ObjectStore, StopTrigger, WorkerPool
from rllm_core.training.nodes import ConversionError, Node, NodeClass, NodePool
from rllm_core.training.shared import SharedRun

if TYPE_CHECKING:
    from rllm_core.plan.schema import SchedulerSection
    from rllm_core.training.island import IslandTrainer

__all__ = [
    "DEFAULT_ANSWER_TIMEOUT_S",
    "LENDING_OPS",
    "NodeAgent",
    "StoreNodeConverter",
    "node_pool",
    "node_urls",
]

LENDING_OPS = ("drain", "collect", "cut", "release")
"""The requests after which a node is lent to the trainer until an ``admit``."""

DEFAULT_ANSWER_TIMEOUT_S = 120.0
"""How long the scheduler waits for the sampler to answer one request (beyond its grace)."""


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _read(store: ObjectStore, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.get(key))
    except ObjectNotFoundError:
        return None


def _nodes_key(shared: SharedRun, *parts: str) -> str:
    return shared.key("nodes", *parts)


def _request_key(shared: SharedRun, node: str, number: int, suffix: str) -> str:
    return _nodes_key(shared, node, f"{number:06d}{suffix}")


def _last_number(shared: SharedRun, node: str, suffix: str) -> int:
    """The number of ``node``'s last request with a ``suffix`` key (``.ask``, ``.answer``);
    0 when there is none."""
    keys = shared.store.list(_nodes_key(shared, node) + "/")
    return max((int(key.rsplit("/", 1)[1][:6]) for key in keys if key.endswith(suffix)), default=0)


def node_pool(
    section: SchedulerSection,
    converter: StoreNodeConverter,
    *,
    only_class: str | None = None,
) -> NodePool:
    """The pool ``[scheduler].nodes`` describes, converted by ``converter``; ``only_class``
    (``--node-class``) limits the nodes that may train to one class."""
    classes = {
        name: NodeClass(name, spot=spec.spot, precision=spec.precision, capacity=spec.capacity)
        for name, spec in section.node_classes.items()
    }
    return NodePool(
        nodes=[Node(node.name, classes[node.node_class]) for node in section.nodes],
        converter=converter,
        grace_s=section.node_grace_s,
        work=converter.work,
        only_class=only_class,
    )


class StoreNodeConverter:
    """The scheduler's :class:`~rllm_core.ports.NodeConverter` for a split run: the sampler's
    half of each step is a request to the sampler role's :class:`NodeAgent` through the object
    store, the trainer's half is ``island`` (the incarnation launched as a job, with the node
    named in its command file). See the module docstring."""

    def __init__(
        self,
        *,
        shared: SharedRun,
        island: IslandTrainer,
        poll_s: float = 1.0,
        answer_timeout_s: float = DEFAULT_ANSWER_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.shared = shared
        self.island = island
        self.poll_s = poll_s
        self.answer_timeout_s = answer_timeout_s
        self.clock = clock
        self.sleep = sleep
        self._asked: dict[str, int] = {}

    @property
    def store(self) -> ObjectStore:
        return self.shared.store

    async def _next_number(self, node: str) -> int:
        if node not in self._asked:
            self._asked[node] = await asyncio.to_thread(_last_number, self.shared, node, ".ask")
        self._asked[node] += 1
        return self._asked[node]

    async def ask(self, node: str, op: str, wait_s: float = 0.0, **fields: Any) -> Any:
        """Send request ``op`` to ``node``'s sampler and return its result; raises
        :class:`~rllm_core.training.nodes.ConversionError` when it failed or got no answer
        within ``wait_s`` plus ``answer_timeout_s`` seconds."""
        number = await self._next_number(node)
        ask = _request_key(self.shared, node, number, ".ask")
        answer_key = _request_key(self.shared, node, number, ".answer")
        body = _encode({"op": op, "ts": self.clock(), **fields})
        if not await asyncio.to_thread(self.store.put_if_absent, ask, body):
            raise ConversionError(
                f"{ask!r} exists in {self.store!r}: another scheduler of this run is converting"
                f" node {node!r}; stop all but one scheduler"
            )
        deadline = self.clock() + wait_s + self.answer_timeout_s
        while (answer := await asyncio.to_thread(_read, self.store, answer_key)) is None:
            if self.clock() >= deadline:
                raise ConversionError(
                    f"the sampler did not answer {op!r} for node {node!r} ({answer_key}) within"
                    f" {wait_s + self.answer_timeout_s:.0f} s: start the run's --role sampler"
                    " process (it carries out the sampler's half of a conversion), or see its log"
                )
            await self.sleep(self.poll_s)
        if "error" in answer:
            raise ConversionError(f"node {node!r}: the sampler could not {op}: {answer['error']}")
        return answer.get("result")

    async def reclaim(self, nodes: list[str]) -> list[str]:
        """Return to sampling every node of ``nodes`` whose last request lent it (a drain,
        collect, cut or release): a scheduler that restarts cannot reattach to the incarnation
        its predecessor ran there, so that node would stay lent for good. Returns their names;
        call it before scheduling."""
        reclaimed = []
        for node in nodes:
            last = await asyncio.to_thread(self._last_ask, node)
            if last is not None and last.get("op") in LENDING_OPS:
                await self.load_release(node)
                await self.start_sampler(node)
                reclaimed.append(node)
        return reclaimed

    def _last_ask(self, node: str) -> dict[str, Any] | None:
        number = _last_number(self.shared, node, ".ask")
        if not number:
            return None
        return _read(self.store, _request_key(self.shared, node, number, ".ask"))

    async def work(self) -> dict[str, int]:
        """The requests in flight on each node, as the sampler last published them."""
        published = await asyncio.to_thread(_read, self.store, _nodes_key(self.shared, "work"))
        return dict(published["in_flight"]) if published is not None else {}

    async def stop_admitting(self, node: str) -> None:
        await self.ask(node, "drain")

    async def collect_finished(self, node: str, grace_s: float) -> int:
        return int(await self.ask(node, "collect", wait_s=grace_s, grace_s=grace_s))

    async def cut_unfinished(self, node: str) -> int:
        return int(await self.ask(node, "cut"))

    async def release_sampler(self, node: str) -> None:
        await self.ask(node, "release")

    async def start_trainer(self, node: str, incarnation: int) -> None:
        self.island.command = msgspec.structs.replace(self.island.command, node=node)
        await self.island.start(incarnation)

    async def train_round(self, node: str) -> bool:
        return await self.island.train_round()

    async def stop_trainer(self, node: str, trigger: StopTrigger) -> None:
        await self.island.stop(trigger)

    async def load_release(self, node: str) -> int:
        return int(await self.ask(node, "load"))

    async def start_sampler(self, node: str) -> None:
        await self.ask(node, "admit")


@dataclass
class _Lent:
    url: str
    served_at_drain: int = 0


class NodeAgent:
    """The sampler role's half of convertible nodes: answers the scheduler's requests for the
    nodes ``nodes`` (``{name: server url}``) on ``pool``, and publishes each node's requests in
    flight every ``poll_s`` (the module docstring). ``load_release`` loads the newest policy
    release into the sampler and its servers and returns its weight version."""

    def __init__(
        self,
        *,
        shared: SharedRun,
        pool: Any,
        nodes: dict[str, str],
        load_release: Callable[[], Awaitable[int]],
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        info: Callable[[str], None] | None = None,
    ) -> None:
        if not isinstance(pool, DrainablePool) or not isinstance(pool, WorkerPool):
            raise RllmError(
                f"[scheduler].nodes lends the [sampler]'s servers to the trainer, and the"
                f" sampler {type(pool).__name__} cannot drain a server: use a sampler over"
                " model servers that can (the vllm sampler), or remove [scheduler].nodes"
            )
        urls = {status.url.rstrip("/") for status in pool.status()}
        for name, url in nodes.items():
            if url.rstrip("/") not in urls:
                raise RllmError(
                    f"[scheduler].nodes: node {name!r} has url {url!r}, which is not one of the"
                    f" [sampler]'s servers ({', '.join(sorted(urls))}): give each node the url"
                    " of the server on its machine"
                )
        self.shared = shared
        self.pool = pool
        self.nodes = {name: url.rstrip("/") for name, url in nodes.items()}
        self.load_release = load_release
        self.poll_s = poll_s
        self.clock = clock
        self.info = info or (lambda message: None)
        self.answered: dict[str, int] = {}
        self._lent: dict[str, _Lent] = {}

    @property
    def store(self) -> ObjectStore:
        return self.shared.store

    @property
    def lent(self) -> list[str]:
        """The nodes drained for the trainer and not admitted again."""
        return sorted(self._lent)

    async def run(self) -> None:
        """Answer requests and publish the work in flight until cancelled."""
        await asyncio.to_thread(self._resume)
        while True:
            await self.step()
            await asyncio.sleep(self.poll_s)

    async def step(self) -> None:
        """Publish the work in flight, then answer every request waiting."""
        work = {name: self.pool.in_flight(url) for name, url in self.nodes.items()}
        body = _encode({"ts": self.clock(), "in_flight": work})
        await asyncio.to_thread(self.store.put, _nodes_key(self.shared, "work"), body)
        for name in self.nodes:
            while True:
                number = self.answered.get(name, 0) + 1
                key = _request_key(self.shared, name, number, "")
                ask = await asyncio.to_thread(_read, self.store, key + ".ask")
                if ask is None:
                    break
                try:
                    answer = {"result": await self._carry_out(name, ask)}
                except Exception as exc:
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                answer["ts"] = self.clock()
                await asyncio.to_thread(self.store.put, key + ".answer", _encode(answer))
                self.answered[name] = number

    def _resume(self) -> None:
        """Skip the requests answered before this process started; a node whose last request
        was a drain, collect, cut or release stays drained."""
        for name, url in self.nodes.items():
            number = self.answered[name] = _last_number(self.shared, name, ".answer")
            if number:
                last = _read(self.store, _request_key(self.shared, name, number, ".ask")) or {}
                if last.get("op") in LENDING_OPS:
                    self.pool.drain(url)
                    self._lent[name] = _Lent(url)

    async def _carry_out(self, name: str, ask: dict[str, Any]) -> Any:
        url, op = self.nodes[name], ask.get("op")
        if op == "drain":
            self.pool.drain(url)
            self._lent[name] = _Lent(url, served_at_drain=self._served(url))
            self.info(f"node {name}: draining {url} for the trainer")
            return None
        if op == "collect":
            deadline = self.clock() + float(ask.get("grace_s", 0.0))
            while self.pool.in_flight(url) and self.clock() < deadline:
                await asyncio.sleep(min(0.05, self.poll_s))
            lent = self._lent.get(name)
            return self._served(url) - (lent.served_at_drain if lent else self._served(url))
        if op == "cut":
            return await self.pool.cut(url)
        if op == "release":
            self.info(f"node {name}: lent to the trainer")
            return None
        if op == "load":
            return await self.load_release()
        if op == "admit":
            self.pool.admit(url)
            self._lent.pop(name, None)
            self.info(f"node {name}: sampling again on {url}")
            return None
        raise ValueError(f"unknown request {op!r}")

    def _served(self, url: str) -> int:
        for status in self.pool.status():
            if status.url.rstrip("/") == url:
                return status.served
        return 0


def node_urls(section: SchedulerSection) -> dict[str, str]:
    """``{name: url}`` of ``[scheduler].nodes``."""
    return {node.name: node.url for node in section.nodes}
