"""Convertible nodes between a split run's processes: the scheduler's StoreNodeConverter asks,
the sampler's NodeAgent answers through the object store. A conversion drains the node's
server, keeps the requests that finish within the grace, cuts the rest (re-sent elsewhere),
launches the incarnation with the node named in its command file, and returns the node with
the newest release; the published work in flight ranks the nodes; a sampler that does not
answer fails the conversion; a restarted agent keeps a lent node drained."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from pydantic import ValidationError
from rllm_core.errors import PlanError, RllmError
from rllm_core.plan.schema import SchedulerSection
from rllm_core.ports import DrainablePool, WorkerPool
from rllm_core.storage.memory_objects import MemoryObjectStore
from rllm_core.training.island import CommandFile
from rllm_core.training.node_agent import NodeAgent, StoreNodeConverter, node_pool, node_urls
from rllm_core.training.nodes import ConversionError, ConvertingTrainer
from rllm_core.training.shared import SharedRun
from rllm_core.types import WorkerStatus
from test_trainer_launchers import launchers, plan  # noqa: F401  (the fixture)

URLS = {"spot-0": "http://10.0.0.1:8000", "gpu-1": "http://10.0.0.2:8000"}
SECTION = SchedulerSection(
    launcher="local-process",
    node_grace_s=0.2,
    node_classes={"spot": {"spot": True}, "h100": {"capacity": 80}},
    nodes=[
        {"name": "spot-0", "url": URLS["spot-0"], "class": "spot"},
        {"name": "gpu-1", "url": URLS["gpu-1"], "class": "h100"},
        {"name": "gpu-2", "url": "http://10.0.0.3:8000", "class": "h100"},
    ],
)


@dataclass
class Server:
    url: str
    in_flight: int = 0
    served: int = 0
    drained: bool = False


@dataclass
class Pool:
    """A server pool that keeps only the counts the agent reads; requests are settled by the
    test (``finish``)."""

    servers: dict[str, Server] = field(default_factory=dict)
    cuts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for url in [*URLS.values(), "http://10.0.0.3:8000"]:
            self.servers[url] = Server(url)

    def status(self) -> list[WorkerStatus]:
        return [
            WorkerStatus(
                url=s.url,
                healthy=not s.drained,
                in_flight=s.in_flight,
                sessions=0,
                served=s.served,
                failures=0,
                last_error="drained" if s.drained else None,
            )
            for s in self.servers.values()
        ]

    async def aclose(self) -> None:
        pass

    def drain(self, url: str) -> None:
        self.servers[url].drained = True

    def in_flight(self, url: str) -> int:
        return self.servers[url].in_flight

    async def cut(self, url: str) -> int:
        cut, self.servers[url].in_flight = self.servers[url].in_flight, 0
        self.cuts.append(url)
        return cut

    def admit(self, url: str) -> None:
        self.servers[url].drained = False

    def finish(self, url: str, count: int) -> None:
        self.servers[url].in_flight -= count
        self.servers[url].served += count


@dataclass
class Island:
    """The launched incarnation's side, as the converter drives it."""

    command: CommandFile = field(
        default_factory=lambda: CommandFile(incarnation=0, run="r", plan_path="p", plan="")
    )
    calls: list[tuple[str, Any]] = field(default_factory=list)

    async def start(self, incarnation: int) -> None:
        self.calls.append(("start", (incarnation, self.command.node)))

    async def train_round(self) -> bool:
        self.calls.append(("round", None))
        return False

    async def stop(self, trigger: str) -> None:
        self.calls.append(("stop", trigger))


def sides(
    store: MemoryObjectStore, pool: Pool, **agent: Any
) -> tuple[StoreNodeConverter, NodeAgent, Island]:
    shared = SharedRun(store, "r")
    island = Island()
    converter = StoreNodeConverter(shared=shared, island=island, poll_s=0.01, answer_timeout_s=2.0)  # type: ignore[arg-type]

    async def load_release() -> int:
        return 5

    return (
        converter,
        NodeAgent(
            shared=shared,
            pool=pool,
            nodes=node_urls(SECTION),
            load_release=load_release,
            poll_s=0.01,
            **agent,
        ),
        island,
    )


async def with_agent(agent: NodeAgent, work: Any) -> Any:
    task = asyncio.ensure_future(agent.run())
    try:
        return await work
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_the_fake_pool_is_a_drainable_worker_pool() -> None:
    assert isinstance(Pool(), DrainablePool) and isinstance(Pool(), WorkerPool)


def test_a_node_converts_to_the_trainer_and_back_through_the_store() -> None:
    store, pool = MemoryObjectStore(), Pool()
    gpu = URLS["gpu-1"]
    pool.servers[gpu].in_flight = 3
    pool.servers["http://10.0.0.3:8000"].in_flight = 9
    converter, agent, island = sides(store, pool)
    lifecycle = ConvertingTrainer(node_pool(SECTION, converter))

    async def convert() -> None:
        await asyncio.sleep(0.05)  # the agent publishes the work in flight first
        start = asyncio.ensure_future(lifecycle.start(1))
        while not pool.servers[gpu].drained:
            await asyncio.sleep(0.01)
        assert not start.done()
        pool.finish(gpu, 2)  # two finish within the grace, one does not
        await start
        assert island.calls == [("start", (1, "gpu-1"))]
        assert pool.servers[gpu].drained and agent.lent == ["gpu-1"]
        await lifecycle.stop("scheduled")

    asyncio.run(with_agent(agent, convert()))
    conversions = lifecycle.pool.conversions
    assert [(c.node, c.to, c.kept, c.cut) for c in conversions] == [
        ("gpu-1", "trainer", 2, 1),
        ("gpu-1", "sampler", 0, 0),
    ]
    assert conversions[1].release == 5 and pool.cuts == [gpu]
    assert not pool.servers[gpu].drained and agent.lent == []
    assert island.calls[-1] == ("stop", "scheduled")
    asks = [
        msgspec.json.decode(store.get(key))["op"]
        for key in sorted(store.list("runs/r/nodes/gpu-1/"))
        if key.endswith(".ask")
    ]
    assert asks == ["drain", "collect", "cut", "release", "load", "admit"]


def test_only_class_and_spot_nodes_never_convert() -> None:
    store, pool = MemoryObjectStore(), Pool()
    converter, _, _ = sides(store, pool)
    ranked = node_pool(SECTION, converter).ranked({"gpu-1": 4, "gpu-2": 1})
    assert [n.name for n in ranked] == ["gpu-2", "gpu-1"]
    with pytest.raises(ConversionError, match="node class 'a100' has no node in the pool"):
        node_pool(SECTION, converter, only_class="a100")
    assert node_pool(SECTION, converter, only_class="spot").ranked() == []


def test_a_sampler_that_does_not_answer_fails_the_conversion_and_names_the_role() -> None:
    store = MemoryObjectStore()
    converter, _, _ = sides(store, Pool())
    converter.answer_timeout_s = 0.05
    with pytest.raises(ConversionError, match=r"did not answer 'drain' for node 'gpu-1'") as info:
        asyncio.run(converter.stop_admitting("gpu-1"))
    assert "--role sampler" in str(info.value)


def test_a_request_that_fails_comes_back_as_the_sampler_error() -> None:
    store, pool = MemoryObjectStore(), Pool()
    converter, agent, _ = sides(store, pool)

    async def failing() -> int:
        raise RuntimeError("the release digest does not match")

    agent.load_release = failing
    with pytest.raises(ConversionError, match="could not load: RuntimeError: the release digest"):
        asyncio.run(with_agent(agent, converter.load_release("gpu-1")))


def test_a_restarted_agent_keeps_a_lent_node_drained_and_answers_the_next_request() -> None:
    store, pool = MemoryObjectStore(), Pool()
    converter, agent, _ = sides(store, pool)
    asyncio.run(with_agent(agent, converter.stop_admitting("gpu-1")))
    restarted_pool = Pool()
    fresh_converter, restarted, _ = sides(store, restarted_pool)
    asyncio.run(with_agent(restarted, fresh_converter.start_sampler("gpu-1")))
    assert restarted.answered["gpu-1"] == 2 and not restarted_pool.servers[URLS["gpu-1"]].drained
    assert fresh_converter._asked["gpu-1"] == 2, "the converter continues the numbering"

    again = Pool()
    _, third, _ = sides(store, again)
    asyncio.run(with_agent(third, asyncio.sleep(0.03)))
    assert not again.servers[URLS["gpu-1"]].drained, "admitted last: sampling"


def test_the_agent_refuses_a_sampler_it_cannot_drain_and_a_node_off_the_pool() -> None:
    shared = SharedRun(MemoryObjectStore(), "r")

    async def load() -> int:
        return 0

    with pytest.raises(RllmError, match="cannot drain a server: use a sampler over model"):
        NodeAgent(shared=shared, pool=object(), nodes={"a": "http://x:1"}, load_release=load)
    with pytest.raises(RllmError, match=r"node 'a' has url 'http://x:1', which is not one of"):
        NodeAgent(shared=shared, pool=Pool(), nodes={"a": "http://x:1"}, load_release=load)


def test_the_plan_refuses_inconsistent_nodes_naming_what_to_change() -> None:
    base: dict[str, Any] = {"launcher": "local-process", "node_classes": {"h100": {}}}

    def refused(**changes: Any) -> str:
        with pytest.raises(ValidationError) as info:
            SchedulerSection(**(base | changes))
        return str(info.value)

    one = [{"name": "a", "url": "http://a:1", "class": "h100"}]
    two = [*one, {"name": "b", "url": "http://b:1", "class": "h100"}]
    assert "it would be the pool's last sampler" in refused(nodes=one)
    assert "name 'a' appears more than once" in refused(nodes=[one[0], {**one[0], "url": "u"}])
    assert "url 'http://a:1' appears more than once" in refused(
        nodes=[one[0], {**one[0], "name": "b", "url": "http://a:1/"}]
    )
    assert "add [scheduler.node_classes.a100] or fix the class" in refused(
        nodes=[one[0], {**two[1], "class": "a100"}]
    )
    assert 'set launcher = "local-process"' in refused(nodes=two, launcher="in-process")
    assert "add [[scheduler.nodes]] or remove node_classes" in refused()
    assert "add [[scheduler.nodes]] or remove node_grace_s" in refused(
        node_classes={}, node_grace_s=5
    )
    assert "Input should be 'bf16'" in refused(nodes=two, node_classes={"h100": {"precision": "q"}})
    assert SchedulerSection(**(base | {"nodes": two})).nodes[1].node_class == "h100"


@pytest.mark.usefixtures("launchers")
def test_plan_check_refuses_nodes_without_a_sampler(plan_builder) -> None:
    data = plan(
        "local-process",
        node_classes={"h100": {}},
        nodes=[
            {"name": "a", "url": "http://a:1", "class": "h100"},
            {"name": "b", "url": "http://b:1", "class": "h100"},
        ],
    )
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(data)
    (only,) = info.value.issues
    assert only.location == "[scheduler].nodes"
    assert "the plan has no [sampler]" in str(only) and "add a [sampler]" in str(only)


def test_a_restarted_scheduler_returns_the_node_its_predecessor_left_lent() -> None:
    store, pool = MemoryObjectStore(), Pool()
    converter, agent, _ = sides(store, pool)

    async def lend_then_restart() -> list[str]:
        await converter.stop_admitting("gpu-1")
        await converter.collect_finished("gpu-1", 0.0)
        assert agent.lent == ["gpu-1"]
        restarted, _, _ = sides(store, pool)  # a new scheduler process: nothing in memory
        return await restarted.reclaim(["spot-0", "gpu-1", "gpu-2"])

    assert asyncio.run(with_agent(agent, lend_then_restart())) == ["gpu-1"]
    assert agent.lent == [] and not pool.servers[URLS["gpu-1"]].drained
    asks = [
        msgspec.json.decode(store.get(key))["op"]
        for key in sorted(store.list("runs/r/nodes/gpu-1/"))
        if key.endswith(".ask")
    ]
    assert asks == ["drain", "collect", "load", "admit"]
    fresh, _, _ = sides(store, pool)
    assert asyncio.run(fresh.reclaim(["gpu-1"])) == [], "a returned node is left alone"


def test_plan_check_shows_each_node_and_class_as_rows() -> None:
    from rllm_core.cli.plan_cmd import settings_rows
    from rllm_core.plan.schema import Plan

    plan = Plan.model_validate({"run": {"name": "r"}, "scheduler": SECTION.model_dump()})
    rows = dict(settings_rows(plan))
    assert rows["[scheduler.node_classes.h100].capacity"] == "80.0"
    assert rows["[scheduler.nodes[1]].class"] == '"h100"'
    assert rows["[scheduler.nodes[2]].url"] == '"http://10.0.0.3:8000"'
    assert not any(key in ("[scheduler].nodes", "[scheduler].node_classes") for key in rows)
