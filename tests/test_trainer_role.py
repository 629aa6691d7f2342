"""The trainer role under the scheduler, in one process over the file object store: a trainer
that S1 stops at a ``scheduled`` cut while no batch waits, and that a new incarnation restores
once batches arrive, continues the version and the buffer watermark, trains every group once,
and ends bitwise equal to a trainer that trained the same batches in one incarnation.

The batches are put into the store as the sampler role puts them (samples appended to the
shared buffer, then the batch's ticket); the trainer is the real torch backend on a tiny
random model, with LoRA (and dropout, so the random generators matter) and full training.
"""

from __future__ import annotations

import asyncio
import io
import random
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

torch = pytest.importorskip("torch")

from reference.run_fakes import TOY  # noqa: E402
from rich.console import Console  # noqa: E402
from rllm_core.algorithms.groups import DatumReport  # noqa: E402
from rllm_core.cli.run_display import PlainDisplay  # noqa: E402
from rllm_core.plan.load import parse_plan  # noqa: E402
from rllm_core.plan.resolve import resolve_plan  # noqa: E402
from rllm_core.plugins import PluginManager  # noqa: E402
from rllm_core.run.components import Components  # noqa: E402
from rllm_core.run.cuts import latest_cut  # noqa: E402
from rllm_core.run.folder import RunFolder  # noqa: E402
from rllm_core.run.metrics import episode_record, rollout_metrics  # noqa: E402
from rllm_core.run.state import DataOrder  # noqa: E402
from rllm_core.training.pipeline import Ticket  # noqa: E402
from rllm_core.training.roles import TrainerRole  # noqa: E402
from rllm_core.training.scheduler import SchedulerJournal  # noqa: E402
from rllm_core.training.shared import SharedRun  # noqa: E402
from rllm_core.types import Cut, Datum, Episode, Sample, Task  # noqa: E402
from rllm_object_store_file.objects import FileObjectStore  # noqa: E402
from rllm_trainer_backend_torch.testing import assert_same_state  # noqa: E402

PLUGINS = PluginManager()
NAME = "role-cut"
VOCAB = 256  # the vocabulary of the tiny_model_dir fixture (tests/conftest.py)
STEPS = 4
BATCH = 2
GROUP = 2
SEED = 3
AGE = 1
LORA = {"rank": 4, "alpha": 8, "dropout": 0.2}
FULL = {"rank": 0}


class Tasks:
    """Four train tasks: the trainer needs only how many there are (its data order)."""

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(task_id=f"t{i}", instruction=f"What is {i} + 2?") for i in range(4)]


# ---------------------------------------------------------------- the sampler's side


class Batches:
    """The batches of the run, put into the store as the sampler role puts them: a batch's
    samples appended to the shared buffer in one call, then its ticket."""

    def __init__(self, store: FileObjectStore) -> None:
        self.shared = SharedRun(store, NAME)
        self.buffer = shared_buffer(store, writer="sampler-test")
        self.data = DataOrder(size=len(Tasks().tasks()), seed=SEED)

    def produce(self, step: int) -> None:
        self.shared.put_ticket(self.append(step))

    def append(self, step: int) -> Ticket:
        """Append batch ``step``'s samples; returns its ticket, not yet put."""
        # The oldest policy the age bound lets batch `step` be sampled with: the sampler
        # starts it once step - 1 - lead is trained (lead = max_policy_age).
        version = max(0, step - 1 - AGE)
        task_ids = [f"t{i}" for i in self.data.take(BATCH)]
        rng = random.Random(step)
        episodes: list[Episode] = []
        samples: list[Sample] = []
        for task_id in task_ids:
            group_id = f"{step}-{task_id}"
            for k in range(GROUP):
                reward = float(k % 2)
                episode = Episode(
                    episode_id=f"{group_id}-e{k}",
                    task_id=task_id,
                    group_id=group_id,
                    session_id=f"{NAME}-s{step}-{task_id}-{k}",
                    trajectories=(),
                    reward=reward,
                )
                length = rng.randrange(4, 10)
                datum = Datum(
                    token_ids=[rng.randrange(VOCAB) for _ in range(length)],
                    logprobs=[-1.0] * length,
                    advantages=[2.0 * reward - 1.0] * length,
                    action_mask=[i >= 2 for i in range(length)],
                    observation_mask=[False] * length,
                    metadata={
                        "session_id": episode.session_id,
                        "episode_id": episode.episode_id,
                        "group_id": group_id,
                    },
                )
                episodes.append(episode)
                samples.append(
                    Sample(
                        datum=datum,
                        group_id=group_id,
                        episode_id=episode.episode_id,
                        weight_version=version,
                        reward=reward,
                    )
                )
        stored = self.buffer.append(samples)
        report = DatumReport(
            groups=BATCH,
            episodes=len(episodes),
            trajectories=len(samples),
            steps=len(samples),
            datums=len(samples),
            steps_per_datum=1.0,
            reward_avg=0.5,
            reward_max=1.0,
        )
        return Ticket(
            step=step,
            first=stored[0].sequence,
            count=len(stored),
            groups=len({s.group_id for s in stored}),
            data=self.data.to_dict(),
            rollout=rollout_metrics(
                episodes=episodes,
                infra_failures=0,
                retries=0,
                report=report.metrics(),
                rollout_s=0.5,
            ),
            episodes=[episode_record(step, e) for e in episodes],
        )


# ---------------------------------------------------------------- the trainer's side


def trainer_role(root: Path, model: Path, lora: dict[str, Any]) -> tuple[TrainerRole, io.StringIO]:
    """A trainer role of the run over the file store at ``root``, and what it prints."""
    plan = parse_plan(
        {
            "run": {"name": NAME, "steps": STEPS, "seed": SEED, "pipeline": "async"},
            "algorithm": {
                "loss": "reinforce",
                "advantage": "grpo",
                "batch_size": BATCH,
                "group_size": GROUP,
                "max_policy_age": AGE,
            },
            "trainer": {
                "name": "torch",
                "model": str(model),
                "device": "cpu",
                "seed": 7,
                "learning_rate": 0.01,
                "lr_schedule": "cosine",
                "warmup_steps": 1,
                "total_steps": 6,
                "micro_batch_size": 2,
                "lora": lora,
            },
            "object_store": {"name": "file", "root": str(root / "store")},
            "scheduler": {"idle_stop_s": 0.05, "poll_s": 0.01},
        },
        path=str(root / "plan.toml"),
    )
    resolved = resolve_plan(plan, manager=PLUGINS, path=str(root / "plan.toml"))

    def build(where: str) -> Any:
        component = resolved.get(where)
        assert component is not None, where
        return component.build()

    components = Components(
        trainer=build("[trainer]"),
        renderer=TOY,
        harness=PLUGINS.get("harness", "single-turn").build({}),
        tasks=Tasks(),
        trace_store=PLUGINS.get("trace_store", "memory").build({}),
        loss=build("[algorithm].loss"),
        advantage=build("[algorithm].advantage"),
        object_store=build("[object_store]"),
    )
    components.sample_buffer = shared_buffer(components.object_store, writer="trainer")
    out = io.StringIO()
    role = TrainerRole(
        shared=SharedRun(components.object_store, NAME),
        resolved=resolved,
        components=components,
        folder=RunFolder.create(root / "runs", NAME),
        display=PlainDisplay(Console(file=out, width=200), STEPS),
        record_datums=True,
        plugins=PLUGINS,
    )
    return role, out


def shared_buffer(store: Any, writer: str | None = None) -> Any:
    """The run's sample buffer in ``store``, where a run with an [object_store] keeps it."""
    config = {"store": store, "prefix": f"runs/{NAME}/buffer", "writer": writer}
    return PLUGINS.get("sample_buffer", "object-store").build(config)


def journal(store: FileObjectStore) -> list[dict[str, Any]]:
    return SchedulerJournal(store, f"runs/{NAME}/scheduler").read()


async def produce_once_stopped(store: FileObjectStore, batches: Batches, steps: range) -> None:
    """Produce ``steps`` once the journal says the running incarnation stopped: their samples,
    then their tickets in order, as a sampler records them (the last ticket ends the data, so
    none may come before the one it follows). The tickets land milliseconds apart, well
    within the restore and the step that come before the trainer could idle again."""
    deadline = time.monotonic() + 60
    while not any(r["kind"] == "stopped" for r in await asyncio.to_thread(journal, store)):
        assert time.monotonic() < deadline, "the idle trainer was never stopped"
        await asyncio.sleep(0.01)
    tickets = [await asyncio.to_thread(batches.append, step) for step in steps]
    for ticket in tickets:
        await asyncio.to_thread(batches.shared.put_ticket, ticket)


def cuts(store: FileObjectStore) -> dict[str, Cut]:
    """Every cut's manifest by name."""
    keys = [k for k in store.list(f"runs/{NAME}/cuts/") if k.endswith("/manifest.json")]
    return {k.split("/")[-2]: msgspec.json.decode(store.get(k), type=Cut) for k in keys}


def rows(folder: RunFolder, name: str) -> list[dict[str, Any]]:
    return RunFolder.read_jsonl(folder.path / name)


@pytest.mark.parametrize("lora", [LORA, FULL], ids=["lora-with-dropout", "full"])
def test_a_scheduled_cut_restored_by_a_new_incarnation_ends_bitwise_equal(
    tiny_model_dir, tmp_path, lora
):
    # Run A: every batch is there from the start; one incarnation trains them all.
    straight_store = FileObjectStore(tmp_path / "a" / "store")
    batches = Batches(straight_store)
    for step in range(1, STEPS + 1):
        batches.produce(step)
    straight, _ = trainer_role(tmp_path / "a", tiny_model_dir, lora)
    result = asyncio.run(asyncio.wait_for(straight.run(), 60))
    assert (result.status, result.step) == ("finished", STEPS)
    assert [
        (r["kind"], r["incarnation"], r.get("trigger"))
        for r in journal(straight_store)
        if r["kind"] in ("started", "stopped")
    ] == [("started", 1, None), ("stopped", 1, "final")]

    # Run B: batches 3 and 4 arrive only after S1 stopped the idle trainer.
    store = FileObjectStore(tmp_path / "b" / "store")
    batches = Batches(store)
    for step in (1, 2):
        batches.produce(step)
    resumed, printed = trainer_role(tmp_path / "b", tiny_model_dir, lora)
    restored: list[int] = []
    restore = resumed.buffer.restore

    def record_restore(watermark: int) -> None:
        restored.append(watermark)
        restore(watermark)

    resumed.buffer.restore = record_restore  # type: ignore[method-assign]

    async def run_b() -> Any:
        trained, _ = await asyncio.gather(
            resumed.run(), produce_once_stopped(store, batches, range(3, STEPS + 1))
        )
        return trained

    result = asyncio.run(asyncio.wait_for(run_b(), 60))
    assert (result.status, result.step) == ("finished", STEPS)

    records = journal(store)
    lifecycle = [
        (r["kind"], r["incarnation"], r.get("trigger"))
        for r in records
        if r["kind"] in ("started", "stopped")
    ]
    assert lifecycle == [
        ("started", 1, None),
        ("stopped", 1, "scheduled"),
        ("started", 2, None),
        ("stopped", 2, "final"),
    ]
    first_stop = next(i for i, r in enumerate(records) if r["kind"] == "stopped")
    decisions = [(r["action"], r["rule"]) for r in records[:first_stop] if r["kind"] == "decision"]
    assert decisions[-1] == ("stop", "idle")

    # The scheduled cut holds step 2, version 2 and the watermark after batch 2's samples;
    # incarnation 2 restored it and went on from there.
    written = cuts(store)
    scheduled = written["0000000002-000001"]
    assert (scheduled.trigger, scheduled.weight_version) == ("scheduled", 2)
    batch_samples = BATCH * GROUP
    assert scheduled.buffer_watermark == 2 * batch_samples - 1
    assert "incarnation 2: restored cut 0000000002-000001 (step 2)" in printed.getvalue()
    assert restored == [-1, scheduled.buffer_watermark]
    final = latest_cut(store, f"runs/{NAME}")
    assert final is not None
    assert (final.name, final.trigger, final.weight_version) == ("0000000004-000002", "final", 4)
    assert written[final.name].buffer_watermark == STEPS * batch_samples - 1
    assert shared_buffer(store).committed() == STEPS * batch_samples - 1
    releases = [
        k.split("/")[-2]
        for k in store.list(f"runs/{NAME}/releases/")
        if k.endswith("manifest.json")
    ]
    assert [r for r in releases if r.endswith("-000002")] == [
        "0000000003-000002",
        "0000000004-000002",
    ]

    # Every step once, every episode's datum trained once, in its own step.
    lines = rows(resumed.folder, "metrics.jsonl")
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    assert [line["weight_version"] for line in lines] == [1.0, 2.0, 3.0, 4.0]
    assert [line["async/policy_age_max"] for line in lines] == [0.0, 1.0, 1.0, 1.0]
    assert all(line["async/dropped_stale"] == 0.0 for line in lines)
    trained = [(row["step"], row["episode_id"]) for row in rows(resumed.folder, "datums.jsonl")]
    assert len({episode for _, episode in trained}) == len(trained) == STEPS * batch_samples
    assert all(episode.startswith(f"{step}-") for step, episode in trained)
    assert trained == [
        (row["step"], row["episode_id"]) for row in rows(straight.folder, "datums.jsonl")
    ]
    episodes = rows(resumed.folder, "episodes.jsonl")
    assert sorted(e["episode_id"] for e in episodes) == sorted(e for _, e in trained)

    # The same updates: losses per step, then weights, optimizer and schedule bit for bit,
    # and the final cuts' files (trainer state and loop state) byte for byte.
    straight_lines = rows(straight.folder, "metrics.jsonl")
    for a, b in zip(straight_lines, lines, strict=True):
        assert {k: v for k, v in a.items() if k.startswith("train/")} == {
            k: v for k, v in b.items() if k.startswith("train/")
        }
    try:
        assert_same_state(straight.c.trainer, resumed.c.trainer)
        straight_final = cuts(straight_store)["0000000004-000001"]
        assert {k: f.sha256 for k, f in straight_final.files.items()} == {
            k: f.sha256 for k, f in written[final.name].files.items()
        }
    finally:
        straight.c.trainer.close()
        resumed.c.trainer.close()
