"""A run with a trainer that chooses where the objective runs (``LossRouting``): the route is
asked for once, on the trainer thread, before the first update; its line goes to stderr, its
record to ``loss_path.json`` and ``summary.json``; a forced native route the objective cannot
take fails the run naming ``[trainer].loss_path``. And a step whose optimizer step the trainer
skipped (every datum dropped) keeps the weight version and the run going, in one process, in
the async pipeline, with a ``[sampler]`` kept on the policy, and in the trainer role.

The loop runs for real over the gateway, a scripted sampler, the toy renderer and the
single-turn harness; only the trainer is a fake."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from reference.run_fakes import TOY, CrashingSource, FakeTrainer
from rich.console import Console
from rllm_core.algorithms.native_losses import LOSS_PATH_FILE, LossRoute, NativeLossError
from rllm_core.cli.run_display import QuietDisplay
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import parse_plan
from rllm_core.plugins import PluginManager
from rllm_core.ports import LossRouting
from rllm_core.rollout.policy_sync import PolicySync
from rllm_core.run.components import Components
from rllm_core.run.folder import RunFolder
from rllm_core.run.state import DataOrder
from rllm_core.storage.memory_objects import MemoryObjectStore
from rllm_core.training.loop import TrainingLoop
from rllm_core.training.pipeline import Ticket
from rllm_core.training.roles import TrainerRole
from rllm_core.training.shared import SharedRun
from rllm_core.training.update import merge_pass_metrics
from rllm_core.types import ExportedWeights

PLUGINS = PluginManager()
PLAN_PATH = "/plans/plan.toml"
NATIVE = LossRoute(
    "native",
    "auto",
    "fake",
    "ppo-clip",
    "loss 'ppo-clip' is the service's 'ppo' kernel",
    "ppo",
    {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
)


class RoutingTrainer(FakeTrainer):
    """A fake trainer that routes the objective (or refuses to, raising ``error``) and drops
    every datum of the ``forward_backward`` calls numbered in ``drop_calls``: those calls and
    the optimizer step after them are skipped, as a managed backend skips them."""

    def __init__(
        self,
        route: LossRoute = NATIVE,
        *,
        error: Exception | None = None,
        drop_calls: tuple[int, ...] = (),
    ) -> None:
        super().__init__(loss=1.0)
        self.route = route
        self.error = error
        self.drop_calls = drop_calls
        self.threads: list[str] = []
        self._skip = False

    def loss_route(self, objective: Any) -> LossRoute:
        self.threads.append(threading.current_thread().name)
        self.calls.append(("loss_route", objective))
        if self.error is not None:
            raise self.error
        return self.route

    def forward_backward(self, datums: Any, objective: Any) -> dict:
        if self.trained + 1 in self.drop_calls:
            self.trained += 1
            self._skip = True
            self.calls.append(("dropped", len(datums)))
            return {
                "fake/dropped_datums": float(len(datums)),
                "fake/skipped_step": 1.0,
                "tokens": 0.0,
                "sequences": 0.0,
            }
        self._skip = False
        return super().forward_backward(datums, objective) | {"fake/skipped_step": 0.0}

    def optim_step(self) -> dict:
        if self._skip:
            self._skip = False
            self.calls.append(("skipped", self.weight_version))
            return {"step": float(self.weight_version), "fake/skipped_step": 1.0}
        return super().optim_step() | {"fake/skipped_step": 0.0}


def plan(**sections: dict[str, Any]) -> Any:
    data: dict[str, Any] = {
        "run": {"steps": 2, "seed": 3},
        "algorithm": {"batch_size": 1, "group_size": 2},
        "sampling": {"max_tokens": 4},
        "rollout": {"max_infra_retries": 0},
    }
    for name, values in sections.items():
        data[name] = data.get(name, {}) | values
    return parse_plan(data, path=PLAN_PATH)


def components(trainer: Any, **extra: Any) -> Components:
    return Components(
        trainer=trainer,
        renderer=TOY,
        harness=PLUGINS.get("harness", "single-turn").build({"max_retries": 0}),
        tasks=CrashingSource(),
        trace_store=PLUGINS.get("trace_store", "memory").build({}),
        loss=object(),
        advantage=PLUGINS.get("advantage_estimator", "grpo").build({}),
        **extra,
    )


def make_loop(tmp_path: Path, trainer: Any, **sections: Any) -> TrainingLoop:
    return TrainingLoop(
        resolved=ResolvedPlan(path=PLAN_PATH, plan=plan(**sections)),
        components=components(trainer),
        folder=RunFolder.create(tmp_path / "runs", "r"),
        display=QuietDisplay(Console(file=io.StringIO()), 2),
    )


def lines(loop: TrainingLoop) -> list[dict[str, Any]]:
    return RunFolder.read_jsonl(loop.folder.metrics)


# ------------------------------------------------------------------ the route


def test_the_route_is_asked_once_on_the_trainer_thread_printed_and_recorded(tmp_path, capsys):
    trainer = RoutingTrainer()
    assert isinstance(trainer, LossRouting)
    loop = make_loop(tmp_path, trainer)
    result = asyncio.run(loop.run())
    assert (result.status, result.step) == ("finished", 2)

    names = [name for name, _ in trainer.calls]
    assert names.count("loss_route") == 1 and names[0] == "loss_route"
    assert names.index("loss_route") < names.index("forward_backward")
    assert trainer.threads == [trainer.threads[0]] and trainer.threads[0].startswith("rllm-trainer")
    # the objective routed is the one trained
    routed = trainer.calls[0][1]
    assert all(args[1] is routed for name, args in trainer.calls if name == "forward_backward")

    captured = capsys.readouterr()
    assert NATIVE.line() in captured.err.splitlines()
    assert NATIVE.line() not in captured.out
    written = json.loads((loop.folder.path / LOSS_PATH_FILE).read_text())
    assert written == NATIVE.record()
    assert json.loads(loop.folder.summary.read_text())["loss_path"] == NATIVE.record()
    assert result.summary["loss_path"]["kernel"] == "ppo"


def test_a_trainer_without_a_route_writes_none(tmp_path, capsys):
    loop = make_loop(tmp_path, FakeTrainer())
    assert asyncio.run(loop.run()).status == "finished"
    assert not (loop.folder.path / LOSS_PATH_FILE).exists()
    assert "loss_path" not in json.loads(loop.folder.summary.read_text())
    assert "loss path:" not in capsys.readouterr().err


def test_a_forced_native_route_the_objective_cannot_take_fails_the_run_naming_the_key(tmp_path):
    refused = NativeLossError(
        "loss_path = 'native', but fake cannot run this objective in its own kernel: loss"
        " 'gspo' declares no server-side form"
    )
    trainer = RoutingTrainer(error=refused)
    loop = make_loop(tmp_path, trainer)
    with pytest.raises(NativeLossError) as caught:
        asyncio.run(loop.run())
    message = str(caught.value)
    assert message.startswith(f"{PLAN_PATH}: [trainer].loss_path: loss_path = 'native', but")
    assert "loss 'gspo' declares no server-side form" in message
    assert 'set loss_path = "auto" or "custom"' in message
    assert caught.value.__cause__ is refused
    assert trainer.trained == 0 and trainer.weight_version == 0
    summary = json.loads(loop.folder.summary.read_text())
    assert summary["status"] == "failed" and summary["last_step"] == 0
    assert summary["error"] == {"type": "NativeLossError", "message": message}
    assert not (loop.folder.path / LOSS_PATH_FILE).exists()


# ------------------------------------------------------------------ skipped optimizer steps


@pytest.mark.parametrize(
    "pipeline",
    [{}, {"run": {"pipeline": "async"}, "algorithm": {"max_policy_age": 1}}],
    ids=["sync", "async"],
)
def test_a_skipped_optimizer_step_keeps_the_version_and_the_run_going(tmp_path, pipeline):
    trainer = RoutingTrainer(drop_calls=(1,))
    loop = make_loop(tmp_path, trainer, **pipeline)
    result = asyncio.run(loop.run())
    assert (result.status, result.step) == ("finished", 2)

    first, second = lines(loop)
    assert first["weight_version"] == 0.0 and first["train/fake/skipped_step"] == 1.0
    assert first["train/fake/dropped_datums"] == 2.0 and first["train/tokens"] == 0.0
    assert "train/loss" not in first
    assert second["weight_version"] == 1.0 and second["train/fake/skipped_step"] == 0.0
    assert second["train/loss"] == 1.0
    assert [c for c in trainer.calls if c[0] in ("skipped", "optim_step")] == [
        ("skipped", 0),
        ("optim_step", 1),
    ]
    assert json.loads(loop.folder.summary.read_text())["weight_version"] == 1


def test_a_step_counts_its_skipped_optimizer_steps_and_dropped_datums(tmp_path):
    trainer = RoutingTrainer(drop_calls=(1,))
    loop = make_loop(tmp_path, trainer, run={"steps": 1}, algorithm={"mini_batches": 2})
    assert asyncio.run(loop.run()).status == "finished"
    (line,) = lines(loop)
    assert line["train/optimizer_steps"] == 2.0 and line["weight_version"] == 1.0
    assert line["train/fake/skipped_step"] == 1.0
    assert line["train/fake/dropped_datums"] == 1.0


def test_merging_sums_skips_over_every_call_and_drops_over_the_first_epoch():
    dropped = ({"fake/dropped_datums": 2.0, "fake/skipped_step": 1.0, "tokens": 0.0}, {})
    kept = ({"loss": 0.5, "action_tokens": 4.0, "fake/dropped_datums": 1.0}, {"grad_norm": 1.0})
    merged = merge_pass_metrics(
        [(0, *dropped), (0, *kept), (1, *dropped), (1, kept[0], kept[1] | {"step": 3.0})]
    )
    assert merged["fake/skipped_step"] == 2.0
    assert merged["fake/dropped_datums"] == 3.0
    assert merged["loss"] == 0.5 and merged["grad_norm"] == 1.0
    assert merged["optimizer_steps"] == 4.0 and merged["step"] == 3.0


class Exporter:
    def __init__(self) -> None:
        self.weight_version = 0
        self.exports: list[str] = []

    def export_weights(self, path: str, *, merge: bool = False) -> ExportedWeights:
        self.exports.append(path)
        Path(path).mkdir(parents=True, exist_ok=True)
        return ExportedWeights(
            path=path, version=self.weight_version, kind="full", base_model="tiny"
        )


class Follower:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.updates: list[int] = []

    def export_path(self, version: int) -> str:
        return str(self.root / f"v{version}")

    async def update_weights(self, exported: ExportedWeights) -> None:
        self.updates.append(exported.version)


def test_a_sampler_is_not_synced_again_after_a_skipped_step(tmp_path):
    trainer, sampler = Exporter(), Follower(tmp_path)
    sync = PolicySync(trainer, sampler)

    async def steps() -> None:
        await sync.sync()  # before the first rollout
        await sync.sync()  # after a skipped optimizer step: the version did not move
        trainer.weight_version = 1
        await sync.sync()

    asyncio.run(steps())
    assert sampler.updates == [0, 1]
    assert trainer.exports == [str(tmp_path / "v0"), str(tmp_path / "v1")]


# ------------------------------------------------------------------ the trainer role


class Releaser(FakeTrainer):
    def save_weights(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "version").write_text(str(self.weight_version))

    def load_weights(self, path: str, version: int) -> None:
        self.weight_version = version


ROLLOUT = {
    "episodes": 0.0,
    "groups": 0.0,
    "infra_retries": 0.0,
    "infra_failures": 0.0,
    "resets": 0.0,
    "zero_variance_groups": 0.0,
}


def test_the_trainer_role_goes_on_when_a_step_leaves_the_version(tmp_path):
    store = MemoryObjectStore()
    shared = SharedRun(store, "r")
    order = DataOrder(size=2, seed=3).to_dict()
    for step in (1, 2):
        shared.put_ticket(Ticket(step, first=1, count=0, groups=0, data=order, rollout=ROLLOUT))
    trainer = Releaser()
    role = TrainerRole(
        shared=shared,
        resolved=ResolvedPlan(
            path=PLAN_PATH,
            plan=plan(run={"pipeline": "async"}, algorithm={"max_policy_age": 1}),
        ),
        components=components(
            trainer,
            object_store=store,
            sample_buffer=PLUGINS.get("sample_buffer", "object-store").build(
                {"store": store, "prefix": "runs/r/buffer"}
            ),
        ),
        folder=RunFolder.create(tmp_path / "runs", "r"),
        display=QuietDisplay(Console(file=io.StringIO()), 2),
    )

    async def rounds() -> list[bool]:
        await role.start(0)
        return [await role.train_round(), await role.train_round()]

    assert asyncio.run(rounds()) == [True, True]
    assert shared.progress() == (2, 0)
    releases = {key.split("/")[3] for key in store.list("runs/r/releases/") if "/" in key}
    assert sorted(r for r in releases if r != "LATEST") == ["0000000000-000000"]
