"""On-policy distillation end to end: a 2-step `rllm-core run` of the SmolLM2 student whose
teacher is a tiny model over SmolLM2's tokenizer scoring at another temperature, checked token
by token against the teacher's own logprobs; and `plan check` on teachers it must refuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from reference.cli_process import overrides, run_cli, run_folder
from reference.quickstart import PLAN, write_tasks
from rllm_core.errors import PlanError
from rllm_core.run.components import prepare_plan

GRPO = 'advantage = { name = "grpo", normalize_std = true }'


def distill_plan(folder: Path, teacher: str) -> Path:
    """The quickstart plan with ``advantage = distill`` and the ``teacher`` table given."""
    tasks, held_out = write_tasks(folder)
    text = PLAN.read_text()
    assert GRPO in text
    text = text.replace(GRPO, f'advantage = {{ name = "distill", teacher = {teacher} }}')
    text = text.replace("../tasks/arithmetic.jsonl", str(tasks))
    text = text.replace("../tasks/arithmetic-eval.jsonl", str(held_out))
    # Two steps run no evaluation: leave out the quickstart's evaluation keys.
    text = "".join(
        line
        for line in text.splitlines(keepends=True)
        if not line.startswith(("eval_every", "keep_best"))
    )
    plan = folder / "plan.toml"
    plan.write_text(text)
    return plan


def test_two_steps_train_on_teacher_minus_student_on_every_sampled_token(
    smollm2_model_dir, tiny_smol_model_dir, tmp_path
):
    teacher = (
        f'{{ name = "torch", model = "{tiny_smol_model_dir}", device = "cpu",'
        " logprob_temperature = 2.0, lora = { rank = 0 } }"
    )
    plan = distill_plan(tmp_path, teacher)
    result = run_cli(
        "run",
        str(plan),
        "--plain",
        "--record-datums",
        *overrides(
            "run.steps=2",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
            "sampling.max_tokens=6",
        ),
        cwd=tmp_path,
        timeout=300,
        columns=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "quickstart")
    resolved = json.loads((run_dir / "plan.resolved.json").read_text())
    configs = {c["where"]: c["config"] for c in resolved["components"]}
    assert configs["[algorithm].advantage.teacher"]["logprob_temperature"] == 2.0

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    rows = [json.loads(line) for line in (run_dir / "datums.jsonl").read_text().splitlines()]
    assert rows

    # The teacher, built as the run built it, scores the recorded datums on its own.
    from rllm_core.types import Datum
    from rllm_trainer_backend_torch.backend import TorchBackend
    from rllm_trainer_backend_torch.plugin import TorchBackendConfig

    scorer = TorchBackend(
        TorchBackendConfig(
            model=str(tiny_smol_model_dir),
            device="cpu",
            logprob_temperature=2.0,
            lora={"rank": 0},
        )
    )
    try:
        datums = [
            Datum(
                token_ids=r["token_ids"],
                logprobs=r["logprobs"],
                advantages=r["advantages"],
                action_mask=r["action_mask"],
                observation_mask=[False] * len(r["token_ids"]),
            )
            for r in rows
        ]
        teacher_logprobs = scorer.compute_logprobs(datums)
    finally:
        scorer.close()

    for step in (1, 2):
        gaps, scored = [], []
        for row, teacher_row in zip(rows, teacher_logprobs, strict=True):
            if row["step"] != step:
                continue
            for advantage, student, mine, action in zip(
                row["advantages"], row["logprobs"], teacher_row, row["action_mask"], strict=True
            ):
                if action:
                    assert advantage == pytest.approx(mine - student, abs=2e-4)
                    gaps.append(student - mine)
                    scored.append(mine)
                else:
                    assert advantage == 0.0
        line = metrics[step - 1]
        assert gaps, f"step {step} trained no sampled token"
        assert line["distill/reverse_kl"] == pytest.approx(sum(gaps) / len(gaps), abs=2e-4)
        assert line["distill/teacher_logprob_mean"] == pytest.approx(
            sum(scored) / len(scored), abs=2e-4
        )


def test_plan_check_refuses_a_teacher_with_another_tokenizer(smollm2_model_dir, tmp_path):
    other = tmp_path / "other-teacher"
    other.mkdir()
    shutil.copyfile(smollm2_model_dir / "config.json", other / "config.json")
    tokenizer = json.loads((smollm2_model_dir / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    swapped = {token: index for token, index in vocab.items() if index in (100, 101)}
    (a, ia), (b, ib) = swapped.items()
    vocab[a], vocab[b] = ib, ia
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    (other / "model.safetensors").write_bytes(b"")
    plan = distill_plan(tmp_path, f'{{ name = "torch", model = "{other}" }}')

    done = run_cli("plan", "check", "--json", str(plan), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [e for e in json.loads(done.stdout)["errors"] if "tokenizer" in e["message"]]
    assert len(errors) == 1, done.stdout
    (error,) = errors
    assert error["section"] == "algorithm" and error["key"] == "advantage.teacher.model"
    assert str(other) in error["message"] and str(smollm2_model_dir) in error["message"]
    assert "id 100" in error["message"]


def test_plan_check_refuses_a_teacher_that_cannot_score_tokens(tmp_path):
    plan = distill_plan(tmp_path, '{ name = "tinker", model = "Qwen/Qwen3-8B" }')
    done = run_cli("plan", "check", "--json", str(plan), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    messages = [e["message"] for e in json.loads(done.stdout)["errors"]]
    assert any("'tinker' cannot score tokens" in m for m in messages), messages


def test_plan_check_refuses_training_keys_in_the_teacher(tmp_path):
    plan = distill_plan(tmp_path, '{ name = "torch", learning_rate = 1e-5 }')
    done = run_cli("plan", "check", "--json", str(plan), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    (error,) = json.loads(done.stdout)["errors"]
    assert error["key"] == "advantage.teacher.learning_rate"
    assert "never trains or samples" in error["message"]


@pytest.mark.parametrize(
    "shaping",
    [
        ("length_penalty = 0.1", "[algorithm] length_penalty = 0.1"),
        (
            'overlong = { mode = "soft", buffer_tokens = 4 }',
            "[algorithm.overlong] mode = 'soft'",
        ),
    ],
)
def test_plan_check_refuses_reward_shaping_the_teacher_alone_ignores(tmp_path, shaping):
    line, named = shaping
    plan = distill_plan(tmp_path, '{ name = "torch" }')
    text = plan.read_text().replace("[algorithm]\n", f"[algorithm]\n{line}\n", 1)
    plan.write_text(text)
    with pytest.raises(PlanError) as refused:
        prepare_plan(plan, (), run_dir=tmp_path / "run", require_models=False)
    message = str(refused.value)
    assert named in message and "'distill' as configured reads no reward" in message
    assert "reward_coef > 0" in message

    plan.write_text(text.replace('name = "distill",', 'name = "distill", reward_coef = 0.5,'))
    prepare_plan(plan, (), run_dir=tmp_path / "run", require_models=False)
