"""Convertible nodes: the converter's calls come in their fixed order both ways, only non-spot
nodes that train in a training precision convert, the last sampler never does, finished
trajectories in flight are kept and unfinished ones cut (never trained), a failed conversion
returns the node to sampling, and S1 drives a pool through ConvertingTrainer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from rllm_core.ports import NodeConverter, TrainerLifecycle
from rllm_core.storage.memory_objects import MemoryObjectStore
from rllm_core.training.nodes import (
    ConversionError,
    ConvertingTrainer,
    Node,
    NodeClass,
    NodePool,
)
from rllm_core.training.scheduler import Controller, SchedulerJournal, SchedulerSettings
from test_scheduler import EPOCH

GPU = NodeClass("h100", spot=False, precision="bf16")
SPOT = NodeClass("h100-spot", spot=True, precision="bf16")
FP8 = NodeClass("l4-fp8", spot=False, precision="fp8")

TO_TRAINER = [
    "stop_admitting",
    "collect_finished",
    "cut_unfinished",
    "release_sampler",
    "start_trainer",
]
TO_SAMPLER = ["stop_trainer", "load_release", "start_sampler"]


@dataclass
class Trajectory:
    name: str
    finishes_in_s: float


@dataclass
class FakeConverter:
    """Records every call; each node has trajectories in flight, finished ones go to
    ``buffer`` (what the trainer trains), cut ones to ``cut``."""

    in_flight: dict[str, list[Trajectory]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    buffer: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    release: int = 7
    fail: set[str] = field(default_factory=set)
    rounds: int = 0

    def _call(self, name: str, node: str) -> None:
        self.calls.append((name, node))
        if name in self.fail:
            raise RuntimeError(f"{name} failed on {node}")

    async def stop_admitting(self, node: str) -> None:
        self._call("stop_admitting", node)

    async def collect_finished(self, node: str, grace_s: float) -> int:
        self._call("collect_finished", node)
        done = [t for t in self.in_flight.get(node, []) if t.finishes_in_s <= grace_s]
        self.buffer += [t.name for t in done]
        self.in_flight[node] = [t for t in self.in_flight.get(node, []) if t not in done]
        return len(done)

    async def cut_unfinished(self, node: str) -> int:
        self._call("cut_unfinished", node)
        cut, self.in_flight[node] = self.in_flight.get(node, []), []
        self.cut += [t.name for t in cut]
        return len(cut)

    async def release_sampler(self, node: str) -> None:
        self._call("release_sampler", node)

    async def start_trainer(self, node: str, incarnation: int) -> None:
        self._call("start_trainer", node)

    async def train_round(self, node: str) -> bool:
        self._call("train_round", node)
        if len(self.buffer) < 2:
            return False
        del self.buffer[:2]
        self.rounds += 1
        return True

    async def stop_trainer(self, node: str, trigger: str) -> None:
        self._call("stop_trainer", node)

    async def load_release(self, node: str) -> int:
        self._call("load_release", node)
        return self.release

    async def start_sampler(self, node: str) -> None:
        self._call("start_sampler", node)


def pool(*nodes: tuple[str, NodeClass], **converter: Any) -> NodePool:
    return NodePool(
        nodes=[Node(name, node_class) for name, node_class in nodes],
        converter=FakeConverter(**converter),
        grace_s=30.0,
    )


def test_fakes_satisfy_the_ports() -> None:
    assert isinstance(FakeConverter(), NodeConverter)
    assert isinstance(ConvertingTrainer(pool(("a", GPU))), TrainerLifecycle)


def test_node_classes_that_may_train() -> None:
    assert GPU.can_train
    assert not SPOT.can_train
    assert "is spot" in (SPOT.trainer_refusal() or "")
    assert not FP8.can_train
    assert "runs fp8, which samples but cannot train (training needs one of bf16, fp16, fp32)" in (
        FP8.trainer_refusal() or ""
    )
    assert NodeClass("a100", precision="fp32").can_train


def test_sampler_to_trainer_and_back_call_in_order() -> None:
    nodes = pool(("a", GPU), ("b", GPU))
    converter = nodes.converter
    assert isinstance(converter, FakeConverter)

    to_trainer = asyncio.run(nodes.to_trainer(incarnation=4))
    assert converter.calls == [(name, "a") for name in TO_TRAINER]
    assert nodes.trainer is not None and nodes.trainer.name == "a"
    assert [n.name for n in nodes.samplers] == ["b"]
    assert (to_trainer.to, to_trainer.incarnation) == ("trainer", 4)

    converter.calls.clear()
    to_sampler = asyncio.run(nodes.to_sampler("scheduled"))
    assert converter.calls == [(name, "a") for name in TO_SAMPLER]
    assert nodes.trainer is None
    assert (to_sampler.to, to_sampler.trigger, to_sampler.release) == ("sampler", "scheduled", 7)
    assert nodes.conversions == [to_trainer, to_sampler]


def test_finished_trajectories_are_kept_and_unfinished_ones_cut() -> None:
    in_flight = {
        "a": [Trajectory("quick", 5.0), Trajectory("at-grace", 30.0), Trajectory("slow", 90.0)],
        "b": [Trajectory("elsewhere", 200.0)],
    }
    nodes = pool(("a", GPU), ("b", GPU), in_flight=in_flight)
    converter = nodes.converter
    assert isinstance(converter, FakeConverter)
    conversion = asyncio.run(nodes.to_trainer(incarnation=1))
    assert (conversion.kept, conversion.cut) == (2, 1)
    assert converter.buffer == ["quick", "at-grace"]
    assert converter.cut == ["slow"]
    assert converter.in_flight["b"] == [Trajectory("elsewhere", 200.0)], "other nodes go on"
    asyncio.run(nodes.train_round())
    assert "slow" not in converter.buffer and converter.buffer == []


def test_spot_and_low_precision_nodes_never_become_the_trainer() -> None:
    nodes = pool(("spot", SPOT), ("fp8", FP8), ("gpu", GPU), ("other", FP8))
    assert nodes.candidate().name == "gpu"
    with pytest.raises(ConversionError, match=r"node 'spot': node class 'h100-spot' is spot"):
        asyncio.run(nodes.to_trainer(incarnation=1, name="spot"))
    with pytest.raises(ConversionError, match=r"node 'fp8': node class 'l4-fp8' runs fp8"):
        asyncio.run(nodes.to_trainer(incarnation=1, name="fp8"))
    assert nodes.converter.calls == []  # type: ignore[attr-defined]
    assert asyncio.run(nodes.to_trainer(incarnation=1)).node == "gpu"

    only_spot = pool(("s1", SPOT), ("s2", SPOT))
    with pytest.raises(ConversionError, match="no node of the pool may become the trainer") as info:
        only_spot.candidate()
    assert "add a non-spot node that trains in bf16, fp16 or fp32" in str(info.value)


def test_the_last_sampler_never_converts() -> None:
    alone = pool(("a", GPU))
    with pytest.raises(ConversionError, match="'a' is the pool's last sampler"):
        asyncio.run(alone.to_trainer(incarnation=1))
    assert alone.converter.calls == [] and alone.samplers[0].name == "a"  # type: ignore[attr-defined]

    two = pool(("a", GPU), ("b", GPU))
    asyncio.run(two.to_trainer(incarnation=1))
    with pytest.raises(ConversionError, match="'a' is already the trainer"):
        asyncio.run(two.to_trainer(incarnation=2))
    assert [n.name for n in two.samplers] == ["b"]


@pytest.mark.parametrize("step", ["start_trainer", "stop_trainer", "train_round"])
def test_a_failed_conversion_returns_the_node_to_sampling(step: str) -> None:
    nodes = pool(("a", GPU), ("b", GPU))
    converter = nodes.converter
    assert isinstance(converter, FakeConverter)
    converter.buffer = ["g1", "g2"]
    if step != "start_trainer":
        asyncio.run(nodes.to_trainer(incarnation=1))
    converter.fail = {step}
    converter.calls.clear()
    with pytest.raises(RuntimeError, match=f"{step} failed on a"):
        if step == "start_trainer":
            asyncio.run(nodes.to_trainer(incarnation=1))
        elif step == "stop_trainer":
            asyncio.run(nodes.to_sampler("preempt"))
        else:
            asyncio.run(nodes.train_round())
    assert converter.calls[-2:] == [("load_release", "a"), ("start_sampler", "a")]
    assert nodes.trainer is None and len(nodes.samplers) == 2


def test_s1_converts_a_node_to_train_and_back() -> None:
    nodes = pool(("spot", SPOT), ("a", GPU), ("b", GPU))
    converter = nodes.converter
    assert isinstance(converter, FakeConverter)
    now = [EPOCH]

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= EPOCH + 10.0 and not converter.buffer and not converter.rounds:
            converter.buffer = ["g1", "g2", "g3", "g4"]

    store = MemoryObjectStore()
    control = Controller(
        lifecycle=ConvertingTrainer(nodes),
        settings=SchedulerSettings(batch_groups=2, poll_s=1.0, idle_stop_s=5.0),
        store=store,
        prefix="runs/r1/scheduler",
        backlog=lambda: len(converter.buffer),
        data_ended=lambda: converter.rounds >= 2,
        clock=lambda: now[0],
        sleep=sleep,
    )
    outcome = asyncio.run(control.run())
    assert outcome.ended == "finished" and outcome.trigger == "final"
    assert converter.rounds == 2
    assert [(c.node, c.to, c.trigger) for c in nodes.conversions] == [
        ("a", "trainer", None),
        ("a", "sampler", "final"),
    ]
    node_calls = [name for name, _ in converter.calls if name != "train_round"]
    assert node_calls == TO_TRAINER + TO_SAMPLER
    assert [r["kind"] for r in SchedulerJournal(store, "runs/r1/scheduler").read()][-1] == "stopped"


def test_ranking_takes_capacity_then_work_in_flight_then_order() -> None:
    small = NodeClass("l40", capacity=48)
    large = NodeClass("h200", capacity=141)
    nodes = pool(("s1", small), ("s2", small), ("spot", NodeClass("x", spot=True, capacity=999)))
    assert [n.name for n in nodes.ranked()] == ["s1", "s2"], "hard conditions first, then order"
    assert [n.name for n in nodes.ranked({"s1": 5, "s2": 1})] == ["s2", "s1"]
    mixed = pool(("s1", small), ("big", large), ("s2", small))
    assert mixed.candidate({"big": 50, "s1": 0}).name == "big", "capacity before work"

    async def work() -> dict[str, int]:
        return {"s1": 3, "s2": 0}

    busy = NodePool(
        nodes=[Node("s1", small), Node("s2", small), Node("s3", small)],
        converter=FakeConverter(),
        work=work,
    )
    assert asyncio.run(busy.to_trainer(incarnation=1)).node == "s2"


def test_only_class_limits_the_nodes_that_convert() -> None:
    nodes = NodePool(
        nodes=[Node("a", GPU), Node("b", NodeClass("a100", capacity=2)), Node("c", GPU)],
        converter=FakeConverter(),
        only_class="h100",
    )
    assert [n.name for n in nodes.ranked()] == ["a", "c"]
    with pytest.raises(ConversionError, match="'b' is of class 'a100', and only 'h100' may train"):
        asyncio.run(nodes.to_trainer(incarnation=1, name="b"))
    with pytest.raises(ConversionError, match=r"node class 'v100' has no node in the pool; its"):
        NodePool(nodes=[Node("a", GPU)], converter=FakeConverter(), only_class="v100")


def test_conversions_are_journaled() -> None:
    records: list[dict[str, Any]] = []

    async def record(entry: dict[str, Any]) -> None:
        records.append(entry)

    lifecycle = ConvertingTrainer(pool(("a", GPU), ("b", GPU)), record=record)
    asyncio.run(lifecycle.start(3))
    asyncio.run(lifecycle.stop("scheduled"))
    assert records == [
        {"kind": "converted", "node": "a", "to": "trainer", "kept": 0, "cut": 0, "incarnation": 3},
        {
            "kind": "converted",
            "node": "a",
            "to": "sampler",
            "kept": 0,
            "cut": 0,
            "trigger": "scheduled",
            "release": 7,
            "incarnation": 3,
        },
    ]
