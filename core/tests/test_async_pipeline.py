"""The async pipeline keeps its promises under random latencies: every trained sample is within
the policy-age bound, no group is trained twice, none is lost but the counted stale drops, at
most ``(1 + lead) * batch_size`` groups are in flight and the next ones start as soon as a step
frees their places (continuous dispatch), and a stop at any moment leaves a checkpoint a resumed
run continues from.

The loop runs for real over the gateway, the toy renderer and the single-turn harness; the
trainer is a fake whose sampler waits a random time per call and reports the version it started
on, and whose updates take a random time on the trainer thread.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from reference.run_fakes import TOY, FakeTrainer
from reference_stores import JsonlSampleBuffer
from rich.console import Console
from rllm_core.cli.run_display import QuietDisplay
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import parse_plan
from rllm_core.plugins import PluginManager
from rllm_core.rollout.sessions import SessionKey
from rllm_core.routing import routing_key
from rllm_core.run.checkpoints import RunCheckpoints
from rllm_core.run.components import Components
from rllm_core.run.folder import RunFolder
from rllm_core.storage.memory_buffer import MemorySampleBuffer
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.training.loop import TrainingLoop
from rllm_core.training.pipeline import DispatchGate
from rllm_core.types import Grade, HarnessOutcome, SampleRequest, SampleResult, Task

PLUGINS = PluginManager()
RUNS = settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    # Each example is a whole run: shrinking a failure would take minutes for little.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
PLAN_PATH = "/plans/async.toml"
STEPS = 6
BATCH = 2
GROUP = 2


class Source:
    """Four tasks; rewards alternate so that every group has a learning signal."""

    def __init__(self) -> None:
        self.graded = 0

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(task_id=f"t{i}", instruction=f"What is {i} + 2?") for i in range(4)]

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Any) -> Grade:
        self.graded += 1
        return Grade(reward=float(self.graded % 2))


class PublishingSampler:
    """Samples after a random wait and reports the version the call started on; keeps, per
    session, the oldest version that sampled for it."""

    def __init__(self, trainer: SlowTrainer) -> None:
        self.trainer = trainer
        self.inner = ScriptedSampler(lambda request: "4", renderer=TOY)
        self.versions: dict[str, int] = {}
        self.in_flight: list[str] = []
        self.most_in_flight = 0
        self.steps_in_flight: set[frozenset[str]] = set()
        self.started_groups: set[tuple[int, str]] = set()
        self.most_groups_in_flight = 0
        self.trained_step = 0
        """The last step the loop told the producer it trained."""

    @property
    def weight_version(self) -> int:
        return self.trainer.weight_version

    async def sample(self, request: SampleRequest) -> SampleResult:
        version = self.trainer.weight_version
        session = routing_key.get()
        self.in_flight.append(session)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))
        self.steps_in_flight.add(frozenset(s.split("-s")[1].split("-")[0] for s in self.in_flight))
        step, task = session.split("-s")[1].split("-")[:2]
        self.started_groups.add((int(step), task))
        trained = self.trained_step
        self.most_groups_in_flight = max(
            self.most_groups_in_flight, sum(1 for s, _ in self.started_groups if s > trained)
        )
        try:
            await asyncio.sleep(self.trainer.rng.uniform(0.0, self.trainer.latency_s))
            result = await self.inner.sample(request)
        finally:
            self.in_flight.remove(session)
        self.versions[session] = min(self.versions.get(session, version), version)
        return msgspec.structs.replace(result, weight_version=version)


class SlowTrainer(FakeTrainer):
    """A :class:`FakeTrainer` whose updates take a random time and whose optimizer step
    publishes ``versions_per_step`` versions (more than one makes queued groups go stale)."""

    def __init__(self, seed: int, *, latency_s: float, versions_per_step: int = 1) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.latency_s = latency_s
        self.versions_per_step = versions_per_step
        self.updates: list[tuple[int, list[dict[str, Any]]]] = []
        self._sampler = PublishingSampler(self)

    def sampler(self) -> PublishingSampler:  # type: ignore[override]
        return self._sampler

    def forward_backward(self, datums: Any, objective: Any) -> dict:
        time.sleep(self.rng.uniform(0.0, self.latency_s))
        self.updates.append((self.weight_version, [dict(d.metadata) for d in datums]))
        return super().forward_backward(datums, objective)

    def optim_step(self) -> dict:
        metrics = super().optim_step()
        self.weight_version += self.versions_per_step - 1
        return metrics


def make_loop(
    folder: RunFolder,
    trainer: SlowTrainer,
    buffer: Any,
    *,
    age: int,
    resume: bool = False,
    steps: int = STEPS,
    concurrency: int = 64,
    min_round_s: float = 0.0,
) -> TrainingLoop:
    plan = parse_plan(
        {
            "run": {"steps": steps, "seed": 5, "pipeline": "async"},
            "algorithm": {"batch_size": BATCH, "group_size": GROUP, "max_policy_age": age},
            "sampling": {"max_tokens": 4},
            "rollout": {"max_infra_retries": 0, "max_concurrency": concurrency},
            "scheduler": {"min_round_s": min_round_s},
        },
        path=PLAN_PATH,
    )
    components = Components(
        trainer=trainer,
        renderer=TOY,
        harness=PLUGINS.get("harness", "single-turn").build({"max_retries": 0}),
        tasks=Source(),
        trace_store=PLUGINS.get("trace_store", "memory").build({}),
        loss=object(),
        advantage=PLUGINS.get("advantage_estimator", "grpo").build({}),
        sample_buffer=buffer,
    )
    loop = TrainingLoop(
        resolved=ResolvedPlan(path=PLAN_PATH, plan=plan),
        components=components,
        folder=folder,
        display=QuietDisplay(Console(file=io.StringIO()), 2),
        resume=resume,
    )
    trained = loop.producer.trained

    def count_trained(step: int) -> None:
        sampler = trainer.sampler()
        sampler.trained_step = max(sampler.trained_step, step)
        trained(step)

    loop.producer.trained = count_trained  # type: ignore[method-assign]
    return loop


def trained_groups(trainer: SlowTrainer) -> list[str]:
    """The groups of each update, each update's counted once."""
    return [group for _, datums in trainer.updates for group in {d["group_id"] for d in datums}]


def check_ages(
    trainer: SlowTrainer, age: int, run: str, versions: dict[str, int] | None = None
) -> None:
    """Every datum ``trainer`` trained on is at most ``age`` versions older than the trainer,
    by the oldest version that sampled any session of its group (``versions``: per session,
    the trainer's sampler's by default)."""
    versions = trainer.sampler().versions if versions is None else versions
    for version, datums in trainer.updates:
        for datum in datums:
            group_oldest = min(
                v for session, v in versions.items() if _group_of(session, run) == datum["group_id"]
            )
            assert version - group_oldest <= age, (version, datum["group_id"])


def _group_of(session: str, run: str) -> str:
    key = SessionKey.parse(session, run=run)
    assert key is not None
    return f"{key.step}-{key.task}"


def metrics(folder: RunFolder) -> list[dict[str, Any]]:
    return RunFolder.read_jsonl(folder.metrics)


@RUNS
@given(seed=st.integers(0, 2**16), age=st.integers(1, 2), versions_per_step=st.sampled_from([1, 2]))
def test_every_trained_group_is_within_the_bound_once_and_the_rest_are_counted(
    tmp_path_factory, seed, age, versions_per_step
):
    trainer = SlowTrainer(seed, latency_s=0.03, versions_per_step=versions_per_step)
    folder = RunFolder.create(tmp_path_factory.mktemp("runs"), "r")
    result = asyncio.run(make_loop(folder, trainer, MemorySampleBuffer(), age=age).run())

    assert (result.status, result.step) == ("finished", STEPS)
    groups = trained_groups(trainer)
    assert len(groups) == len(set(groups)), "a group was trained twice"
    check_ages(trainer, age, folder.path.name)
    lines = metrics(folder)
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    dropped = sum(line["async/dropped_stale"] for line in lines)
    produced = {f"{step}-t{i}" for step in range(1, STEPS + 1) for i in range(4)}
    produced = {g for g in produced if g in {e["group_id"] for e in _episodes(folder)}}
    assert len(produced) == STEPS * BATCH
    assert len(set(groups)) + dropped == len(produced)
    assert max(line["async/policy_age_max"] for line in lines) <= age
    if versions_per_step == 1:
        assert dropped == 0, "the producer's lead keeps every group within the bound"
    flight = (1 + age) * BATCH
    assert trainer.sampler().most_groups_in_flight <= flight
    assert all(0.0 <= line["async/in_flight_groups"] <= flight for line in lines)
    assert all(0.0 <= line["async/running_rollouts"] <= 64 for line in lines)
    assert 0.0 < result.summary["in_flight_groups"] <= flight


@settings(max_examples=60, deadline=None)
@given(
    lead=st.integers(0, 2),
    groups_per_step=st.integers(1, 3),
    steps=st.integers(1, 6),
    delays=st.lists(st.integers(0, 5), min_size=18, max_size=18),
)
def test_dispatch_keeps_the_flight_full_and_every_group_within_the_lead(
    lead, groups_per_step, steps, delays
):
    """Groups complete in a random order (each after a random number of event-loop turns);
    a step trains once its batch is complete. Every group starts with its step within the
    lead of the trainer, the flight never exceeds its capacity, and once a step is trained
    the flight refills to capacity at once, wherever the data allows."""
    gate = DispatchGate(trained=0, lead=lead, groups_per_step=groups_per_step, first=1)
    capacity = (1 + lead) * groups_per_step
    total = steps * groups_per_step
    started: dict[tuple[int, int], int] = {}
    done: set[tuple[int, int]] = set()

    async def group(step: int, index: int) -> None:
        for _ in range(delays[(step * groups_per_step + index) % len(delays)]):
            await asyncio.sleep(0)
        done.add((step, index))

    async def dispatch() -> None:
        async with asyncio.TaskGroup() as groups:
            for step in range(1, steps + 1):
                for index in range(groups_per_step):
                    await gate.acquire(step, index)
                    assert gate.in_flight.value <= capacity
                    started[(step, index)] = trained[0]
                    groups.create_task(group(step, index))

    trained = [0]

    async def train() -> None:
        for step in range(1, steps + 1):
            while any((step, i) not in done for i in range(groups_per_step)):
                await asyncio.sleep(0)
            trained[0] = step
            gate.trained(step)
            for _ in range(3):  # let the dispatcher run
                await asyncio.sleep(0)
            left = total - step * groups_per_step
            assert gate.in_flight.value == min(capacity, left), "the flight was not refilled"

    async def both() -> None:
        await asyncio.wait_for(asyncio.gather(dispatch(), train()), 10)

    asyncio.run(both())
    assert len(started) == total and gate.in_flight.value == 0
    for (step, _), at in started.items():
        assert step - 1 - at <= lead, "a group started further ahead than the lead allows"


def _episodes(folder: RunFolder) -> list[dict[str, Any]]:
    return RunFolder.read_jsonl(folder.episodes)


@RUNS
@given(
    seed=st.integers(0, 2**16),
    stop_after_s=st.floats(0.0, 1.5),
    durable=st.booleans(),
)
def test_a_stop_at_any_moment_leaves_a_checkpoint_the_resumed_run_continues(
    tmp_path_factory, seed, stop_after_s, durable
):
    root = tmp_path_factory.mktemp("runs")
    folder = RunFolder.create(root, "r")
    buffer_path = root / "buffer"

    def buffer() -> Any:
        return JsonlSampleBuffer(str(buffer_path)) if durable else MemorySampleBuffer()

    first = SlowTrainer(seed, latency_s=0.05)
    loop = make_loop(folder, first, buffer(), age=2)

    async def run_and_stop() -> Any:
        asyncio.get_running_loop().call_later(stop_after_s, loop._on_stop)
        return await loop.run()

    stopped = asyncio.run(run_and_stop())
    lines = metrics(folder)
    assert [line["step"] for line in lines] == list(range(1, stopped.step + 1))
    if stopped.step == 0:
        assert RunCheckpoints(folder.checkpoints).latest() is None
        return
    latest = RunCheckpoints(folder.checkpoints).latest()
    assert latest is not None and latest.step == stopped.step
    checkpoint = latest.path
    saved = json.loads((checkpoint / "loop.json").read_text())
    assert saved["step"] == stopped.step
    assert saved["buffer_watermark"] == loop.buffer.committed()
    assert int((checkpoint / "trainer" / "version").read_text()) == first.weight_version
    if stopped.step == STEPS:
        return

    second = SlowTrainer(seed + 1, latency_s=0.05)
    resumed = make_loop(folder, second, buffer(), age=2, resume=True)
    result = asyncio.run(resumed.run())
    assert (result.status, result.step) == ("finished", STEPS)
    groups = trained_groups(first) + trained_groups(second)
    assert len(groups) == len(set(groups)), "a group was trained twice"
    assert len(groups) == STEPS * BATCH, "a group was lost"
    assert [line["step"] for line in metrics(folder)] == list(range(1, STEPS + 1))
    check_ages(second, 2, folder.path.name, first.sampler().versions | second.sampler().versions)
    assert second.updates[0][0] == saved_version(checkpoint)


def saved_version(checkpoint: Path) -> int:
    return int((checkpoint / "trainer" / "version").read_text())


class StopAfter(QuietDisplay):
    """Sends this process SIGINT once step ``step`` is recorded."""

    def __init__(self, step: int) -> None:
        super().__init__(Console(file=io.StringIO()), 2)
        self.step = step

    def step_finished(self, line: dict[str, Any]) -> None:
        super().step_finished(line)
        if line["step"] == self.step:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("durable", [True, False])
def test_queued_batches_are_kept_by_a_durable_buffer_and_rolled_out_again_from_memory(
    tmp_path, durable
):
    folder = RunFolder.create(tmp_path / "runs", "r")

    def buffer() -> Any:
        return JsonlSampleBuffer(str(tmp_path / "buffer")) if durable else MemorySampleBuffer()

    first = SlowTrainer(1, latency_s=0.0)
    first.forward_backward = _slowly(first.forward_backward)  # type: ignore[method-assign]
    loop = make_loop(folder, first, buffer(), age=2)
    loop.display = StopAfter(2)
    stopped = asyncio.run(loop.run())
    assert stopped.status == "interrupted" and 2 <= stopped.step < STEPS
    after = stopped.step + 1
    queued = [row["step"] for row in RunFolder.read_jsonl(folder.queue)]
    assert after in queued, "the producer ran ahead of the trainer"

    second = SlowTrainer(2, latency_s=0.0)
    result = asyncio.run(make_loop(folder, second, buffer(), age=2, resume=True).run())
    assert (result.status, result.step) == ("finished", STEPS)
    resampled = {_group_of(s, folder.path.name).split("-")[0] for s in second.sampler().versions}
    assert (str(after) in resampled) is not durable
    groups = trained_groups(first) + trained_groups(second)
    assert sorted(groups) == sorted(set(groups)) and len(groups) == STEPS * BATCH


def _slowly(call: Any) -> Any:
    def slow(*args: Any) -> Any:
        time.sleep(0.3)
        return call(*args)

    return slow


def test_batches_roll_out_side_by_side_within_one_concurrency_limit(tmp_path):
    trainer = SlowTrainer(3, latency_s=0.05)
    trainer.forward_backward = _slowly(trainer.forward_backward)  # type: ignore[method-assign]
    folder = RunFolder.create(tmp_path / "runs", "r")
    loop = make_loop(folder, trainer, MemorySampleBuffer(), age=2, concurrency=3)
    result = asyncio.run(loop.run())
    assert (result.status, result.step) == ("finished", STEPS)
    sampler = trainer.sampler()
    assert sampler.most_in_flight <= 3, "[rollout].max_concurrency holds over all batches"
    assert max(len(steps) for steps in sampler.steps_in_flight) >= 2, "batches overlapped"
    check_ages(trainer, 2, folder.path.name)
    waited = sum(line["async/sampler_wait_s"] for line in metrics(folder))
    assert 0.0 < waited <= result.summary["wall_s"], "each wait is counted once"


def test_min_round_s_spaces_the_starts_of_the_batches(tmp_path):
    trainer = SlowTrainer(4, latency_s=0.0)
    folder = RunFolder.create(tmp_path / "runs", "r")
    loop = make_loop(folder, trainer, MemorySampleBuffer(), age=2, steps=3, min_round_s=0.25)
    started: list[float] = []
    loop.parts.display.step_started = lambda step, rollouts: started.append(time.monotonic())
    result = asyncio.run(loop.run())
    assert (result.status, result.step) == ("finished", 3)
    assert len(started) == 3
    assert all(b - a >= 0.25 for a, b in itertools.pairwise(started)), started


class FailingBuffer(MemorySampleBuffer):
    """Refuses its second append, as a full disk would."""

    def append(self, samples: Any) -> list[Any]:
        if self.pending() or self.committed() >= 0:
            raise OSError(28, "No space left on device")
        return super().append(samples)


def test_a_buffer_that_fails_ends_the_run_with_its_error_instead_of_a_wait(tmp_path):
    folder = RunFolder.create(tmp_path / "runs", "r")
    loop = make_loop(folder, SlowTrainer(4, latency_s=0.0), FailingBuffer(), age=1)
    with pytest.raises(OSError, match="No space left"):
        asyncio.run(asyncio.wait_for(loop.run(), 60))
    assert json.loads(folder.summary.read_text())["status"] == "failed"
