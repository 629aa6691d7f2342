"""How runs and evaluations fail: too many excluded rollouts, a gateway port in use, and the
components a sampling-only build needs. The loop runs for real over the gateway, a scripted
sampler, the toy renderer and the single-turn harness; only the trainer is a fake."""

from __future__ import annotations

import asyncio
import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reference.run_fakes import SAMPLING_KINDS, TOY, CrashingSource, FakeTrainer, spec_components
from rich.console import Console
from rllm_core.cache import CACHE_ENV
from rllm_core.cli.run_display import QuietDisplay
from rllm_core.errors import ModelNotCachedError, PlanError
from rllm_core.evaluation import Evaluation
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import parse_plan
from rllm_core.plugins import PluginManager
from rllm_core.plugins.specs import Kind
from rllm_core.rollout import (
    InfraFailure,
    RolloutBatch,
    TooManyFailedRollouts,
    check_failures,
)
from rllm_core.rollout.gateway_address import GatewayBindError, check_gateway_address
from rllm_core.run.checkpoints import checkpoint_steps
from rllm_core.run.components import (
    BuildError,
    Components,
    build_components,
    prepare_plan,
)
from rllm_core.run.folder import RunFolder
from rllm_core.training.loop import TrainingLoop
from rllm_core.types import Episode, Task, Termination

PLUGINS = PluginManager()
PLAN_PATH = "/plans/plan.toml"


# ------------------------------------------------------------------ the policy by itself


def scored(task_id: str, index: int) -> Episode:
    return Episode(
        episode_id=f"e{index}",
        task_id=task_id,
        group_id=f"1-{task_id}",
        session_id=f"e{index}",
        trajectories=[],
        reward=0.0,
        termination=Termination.DONE,
    )


def crash(task_id: str, index: int, error: str = "VerifierCrashed: exit 3\nboom") -> InfraFailure:
    return InfraFailure(task_id, index, 1, Termination.VERIFIER_ERROR, error)


def test_excluded_rollouts_up_to_the_fraction_pass_and_beyond_it_stop():
    half = RolloutBatch(groups=[[scored("a", 0)]], infra_failures=[crash("a", 1)])
    check_failures(half, max_fraction=0.5, context="step 1")
    with pytest.raises(TooManyFailedRollouts):
        check_failures(half, max_fraction=0.49, context="step 1")
    every = RolloutBatch(groups=[[]], infra_failures=[crash("a", 0), crash("a", 1)])
    check_failures(every, max_fraction=1.0, context="step 1")
    check_failures(RolloutBatch(groups=[[scored("a", 0)]]), max_fraction=0.0, context="step 1")


def test_the_message_names_the_kind_the_task_its_error_and_what_to_do(tmp_path):
    task = Task(task_id="hello", instruction="x", data={"task_dir": str(tmp_path / "hello")})
    batch = RolloutBatch(
        groups=[[]],
        infra_failures=[
            InfraFailure("hello", 0, 0, Termination.SANDBOX_ERROR, "SandboxGone: gone"),
            crash("hello", 1),
            crash("hello", 2),
        ],
    )
    with pytest.raises(TooManyFailedRollouts) as caught:
        check_failures(batch, max_fraction=0.5, context="step 4", tasks=[task])
    message = str(caught.value)
    assert message.startswith("step 4: 3 of 3 rollouts failed on infrastructure")
    assert "(2 verifier_error, 1 sandbox_error)" in message
    assert "max_failed_fraction = 0.5" in message
    assert "Task 'hello' (rollout 1, verifier_error, after 2 attempts)" in message
    assert "VerifierCrashed: exit 3\nboom" in message
    assert f"{tmp_path / 'hello'}/tests/test.sh" in message
    assert f"rllm-core tasks check {tmp_path} --solve" in message
    assert "raise [rollout].max_failed_fraction" in message
    assert caught.value.to_dict() == {
        "kind": "verifier_error",
        "task_id": "hello",
        "error": "VerifierCrashed: exit 3\nboom",
        "failed": 3,
        "rollouts": 3,
    }


# ------------------------------------------------------------------ the loop, for real


def plan(**sections: dict[str, Any]) -> Any:
    data: dict[str, Any] = {
        "run": {"steps": 2, "save_every": 1, "seed": 3},
        "algorithm": {"batch_size": 1, "group_size": 2},
        "sampling": {"max_tokens": 4},
        "rollout": {"max_infra_retries": 0},
    }
    for name, values in sections.items():
        data[name] = data.get(name, {}) | values
    return parse_plan(data, path=PLAN_PATH)


def components(source: Any, trainer: FakeTrainer) -> Components:
    return Components(
        trainer=trainer,
        renderer=TOY,
        harness=PLUGINS.get("harness", "single-turn").build({"max_retries": 0}),
        tasks=source,
        trace_store=PLUGINS.get("trace_store", "memory").build({}),
        loss=object(),
        advantage=PLUGINS.get("advantage_estimator", "grpo").build({}),
    )


def make_loop(tmp_path: Path, source: Any, trainer: FakeTrainer, **sections: Any) -> TrainingLoop:
    return TrainingLoop(
        resolved=ResolvedPlan(path=PLAN_PATH, plan=plan(**sections)),
        components=components(source, trainer),
        folder=RunFolder.create(tmp_path / "runs", "r"),
        display=QuietDisplay(Console(file=io.StringIO()), 2),
    )


@pytest.mark.parametrize(
    "pipeline",
    [{}, {"run": {"pipeline": "async"}, "algorithm": {"max_policy_age": 1}}],
    ids=["sync", "async"],
)
def test_a_step_with_too_many_excluded_rollouts_fails_the_run_untrained(tmp_path, pipeline):
    trainer = FakeTrainer()
    loop = make_loop(tmp_path, CrashingSource(good=2), trainer, **pipeline)
    result = asyncio.run(loop.run())

    assert (result.status, result.exit_code, result.step) == ("failed", 1, 1)
    assert trainer.trained == 1, "step 1 trained; step 2 never reached the trainer"
    assert [Path(p).parent.name for p in trainer.saved] == ["cut-0000000001-000001"]
    assert checkpoint_steps(loop.folder.checkpoints) == [1]
    assert [row["step"] for row in RunFolder.read_jsonl(loop.folder.metrics)] == [1]
    summary = json.loads(loop.folder.summary.read_text())
    assert summary["status"] == "failed" and summary["last_step"] == 1
    assert summary["reason"] == result.reason
    assert result.reason.startswith("step 2: 2 of 2 rollouts failed on infrastructure")
    assert "checker exploded" in result.reason
    assert summary["failure"]["kind"] == "verifier_error"


def test_a_raised_max_failed_fraction_lets_the_run_go_on(tmp_path):
    trainer = FakeTrainer()
    loop = make_loop(tmp_path, CrashingSource(good=2), trainer, rollout={"max_failed_fraction": 1})
    result = asyncio.run(loop.run())
    assert (result.status, result.exit_code, result.step) == ("finished", 0, 2)
    assert json.loads(loop.folder.summary.read_text())["infra_failures"] == 2.0


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def test_a_port_taken_before_the_gateway_binds_fails_naming_the_key(tmp_path, taken_port):
    with pytest.raises(GatewayBindError) as early:
        check_gateway_address("127.0.0.1", taken_port, plan_path=PLAN_PATH)
    trainer = FakeTrainer()
    loop = make_loop(tmp_path, CrashingSource(good=9), trainer, gateway={"port": taken_port})
    with pytest.raises(GatewayBindError) as late:
        asyncio.run(loop.run())
    assert str(late.value) == str(early.value)
    message = str(early.value)
    assert message.startswith(f"{PLAN_PATH}: [gateway].port: port {taken_port} on 127.0.0.1")
    assert "already in use" in message and "set port = 0 under [gateway]" in message
    assert trainer.saved == [] and trainer.trained == 0
    check_gateway_address("127.0.0.1", 0, plan_path=PLAN_PATH)


def test_an_evaluation_where_every_attempt_failed_reports_it_with_complete_results(tmp_path):
    def evaluation(source: CrashingSource, run_id: str, **extra: Any) -> Evaluation:
        return Evaluation(
            plan=plan(),
            components=components(source, FakeTrainer()),
            tasks=source.tasks(),
            attempts=2,
            run_id=run_id,
            **extra,
        )

    outcome = asyncio.run(evaluation(CrashingSource(good=0), "eval-1", plan_path=PLAN_PATH).run())
    assert outcome.failure is not None
    message = str(outcome.failure)
    assert message.startswith("evaluation: 4 of 4 rollouts failed on infrastructure")
    assert "so no attempt was scored" in message and "checker exploded" in message
    assert "max_failed_fraction" not in message
    assert [len(r.infra_failures) for r in outcome.results] == [2, 2]
    assert outcome.summary["tasks_unscored"] == 2

    assert asyncio.run(evaluation(CrashingSource(good=3), "eval-2").run()).failure is None


# ------------------------------------------------------------------ what a build needs


def resolved_with(*wheres: str) -> ResolvedPlan:
    kinds = SAMPLING_KINDS | {
        "[algorithm].loss": Kind.LOSS,
        "[algorithm].advantage": Kind.ADVANTAGE_ESTIMATOR,
    }
    found = spec_components({where: kinds[where] for where in wheres})
    return ResolvedPlan(path=PLAN_PATH, plan=plan(), components=found)


def test_sampling_builds_need_no_loss_or_advantage():
    sampling = resolved_with("[trainer]", "[renderer]", "[harness]", "[tasks]", "[trace_store]")
    built = build_components(sampling, training=False)
    assert built.trainer == "trainer_backend:x"
    assert built.loss is None and built.advantage is None
    with pytest.raises(BuildError) as caught:
        build_components(sampling)
    assert str(caught.value) == (
        f"{PLAN_PATH}: the plan selects no [algorithm].loss, [algorithm].advantage; a training"
        " run needs each of them"
    )


def test_bad_values_say_what_to_do():
    with pytest.raises(PlanError) as caught:
        parse_plan({"rollout": {"max_failed_fraction": 1.5}}, path=PLAN_PATH)
    (issue,) = caught.value.issues
    assert str(issue) == (
        f"{PLAN_PATH}: [rollout].max_failed_fraction: Input should be less than or equal to 1"
        " (got 1.5); fix the value, or remove the key for the default 0.5"
    )


# ------------------------------------------------------------------ preparing a plan


def write_plan(folder: Path, text: str) -> Path:
    path = folder / "plan.toml"
    path.write_text(text)
    return path


TORCH_TRAINER = '[trainer]\nname = "torch"\nmodel = "smollm2-135m-instruct"\n'


def test_an_uncached_model_fails_while_preparing_even_with_a_tokenizer_given(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty"))
    text = TORCH_TRAINER + f'[renderer]\nname = "chatml"\ntokenizer = "{tmp_path}"\n'
    with pytest.raises(ModelNotCachedError, match="rllm-core models pull smollm2-135m-instruct"):
        prepare_plan(write_plan(tmp_path, text), (), run_dir=tmp_path / "run")


def test_a_logprob_temperature_the_run_replaces_is_noted(smollm2_model_dir, tmp_path):
    text = "[sampling]\ntemperature = 0.5\n" + TORCH_TRAINER + "logprob_temperature = 1.0\n"
    path = write_plan(tmp_path, text)
    resolved = prepare_plan(path, (), run_dir=tmp_path / "run")
    assert resolved.get("[trainer]").config.logprob_temperature == 0.5
    assert resolved.notes == (
        f"{path}: [trainer].logprob_temperature: 1.0 is replaced by [sampling].temperature ="
        " 0.5 (recomputed logprobs must match the sampler's); remove the key",
    )
    same = ("trainer.logprob_temperature=0.5",)
    assert prepare_plan(path, same, run_dir=tmp_path / "run").notes == ()


def test_the_trainer_follows_run_deterministic_and_a_contrary_key_is_noted(
    smollm2_model_dir, tmp_path
):
    path = write_plan(tmp_path, TORCH_TRAINER)
    assert prepare_plan(path, (), run_dir=tmp_path / "run").get("[trainer]").config.deterministic
    off = prepare_plan(path, ("run.deterministic=false",), run_dir=tmp_path / "run")
    assert off.get("[trainer]").config.deterministic is False and off.notes == ()

    contrary = write_plan(tmp_path, TORCH_TRAINER + "deterministic = false\n")
    resolved = prepare_plan(contrary, (), run_dir=tmp_path / "run")
    assert resolved.get("[trainer]").config.deterministic is True
    assert resolved.notes == (
        f"{contrary}: [trainer].deterministic: False is replaced by [run].deterministic = true"
        " (one switch for the whole run); remove the key",
    )


def test_plan_check_prints_the_notes(smollm2_model_dir, tmp_path):
    from click.testing import CliRunner
    from rllm_core.cli import main

    path = write_plan(tmp_path, TORCH_TRAINER + "logprob_temperature = 0.7\n")
    result = CliRunner().invoke(main, ["plan", "check", str(path)])
    assert result.exit_code == 0
    assert "warning:" in result.stderr and "[trainer].logprob_temperature: 0.7" in result.stderr
    result = CliRunner().invoke(main, ["plan", "check", str(path), "--json"])
    assert json.loads(result.stdout)["notes"][0].endswith("remove the key")


# ------------------------------------------------------------------ epochs, mini-batches


def test_epochs_and_mini_batches_take_that_many_optimizer_steps_per_step(tmp_path):
    trainer = FakeTrainer()
    loop = make_loop(
        tmp_path,
        CrashingSource(),
        trainer,
        run={"steps": 1},
        algorithm={"batch_size": 2, "group_size": 2, "epochs": 2, "mini_batches": 2},
    )
    result = asyncio.run(loop.run())
    assert result.status == "finished"
    kinds = [kind for kind, _ in trainer.calls]
    assert kinds == ["forward_backward", "optim_step"] * 4, "2 epochs x 2 mini-batches"
    passes = [value for kind, value in trainer.calls if kind == "forward_backward"]
    first, second = [d for d, _ in passes[:2]]
    assert len(first) == len(second) == 2, "4 datums in 2 mini-batches"
    assert [d for d, _ in passes[2:]] == [first, second], "the second epoch repeats the first"
    assert all(objective.proximal == "rollout" for _, objective in passes)
    assert all(d.proximal_logprobs is None for datums, _ in passes for d in datums)
    (line,) = RunFolder.read_jsonl(loop.folder.metrics)
    assert line["train/optimizer_steps"] == 4.0
    assert line["weight_version"] == 4.0
    assert line["train/loss"] == pytest.approx(1.5), "mean of the four calls (0, 1, 2, 3)"


def test_recompute_scores_the_batch_once_before_its_first_update(tmp_path):
    trainer = FakeTrainer()
    loop = make_loop(
        tmp_path,
        CrashingSource(),
        trainer,
        run={"steps": 1},
        algorithm={"proximal": "recompute", "mini_batches": 2},
    )
    asyncio.run(loop.run())
    assert trainer.calls[0] == ("compute_logprobs", 0)
    assert [kind for kind, _ in trainer.calls].count("compute_logprobs") == 1
    passes = [value for kind, value in trainer.calls if kind == "forward_backward"]
    assert len(passes) == 2
    for datums, objective in passes:
        assert objective.proximal == "recompute"
        assert all(d.proximal_logprobs == [-0.5] * len(d.token_ids) for d in datums)
