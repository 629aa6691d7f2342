"""``rllm-core sft`` with the tinker and fireworks backends over their fake services: every
step goes through the service's own ``cross_entropy`` loss (never the custom-loss path), the
weights of each request make the service's sum the token-mean NLL of the step's trained
tokens, and the ``train/nll`` the run records is that mean computed from the fake model by
hand."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from reference.run_cuts import checkpoint_of, cut_steps

REPO = Path(__file__).resolve().parents[1]
BACKENDS = REPO / "plugins" / "trainer-backends"
FAKE_MODULE = "rllm_trainer_backend_tinker_tests_fake"

EXAMPLES = [
    {
        "messages": [
            {"role": "system", "content": "Answer with one word."},
            {"role": "user", "content": f"Say the word number {n}."},
            {"role": "assistant", "content": word},
        ]
    }
    for n, word in enumerate(["apple", "river", "candle", "orbit"])
]


def tinker_fake():
    if FAKE_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            FAKE_MODULE, BACKENDS / "tinker" / "tests" / "tinker_fake.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[FAKE_MODULE] = module
        spec.loader.exec_module(module)
    return sys.modules[FAKE_MODULE]


def fireworks_fake():
    name = "rllm_trainer_backend_fireworks_tests_fake"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, BACKENDS / "fireworks" / "tests" / "fake_fireworks.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def write_plan(folder: Path, tokenizer: Path, trainer: str, sft: str = "") -> Path:
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES), encoding="utf-8")
    plan = folder / "sft.toml"
    plan.write_text(
        f"""
[run]
name = "sft"
seed = 0
save_every = 2

[sft]
data = "train.jsonl"
epochs = 2
batch_size = 2
{sft}

[trainer]
{trainer}

[renderer]
name = "chatml"
tokenizer = "{tokenizer}"

[[loggers]]
name = "jsonl"
""",
        encoding="utf-8",
    )
    return plan


def test_sft_steps_run_on_tinkers_cross_entropy_loss(smollm2_model_dir, tmp_path, monkeypatch):
    from click.testing import CliRunner
    from rllm_core.cli import main
    from rllm_trainer_backend_tinker import backend as tinker_backend
    from transformers import AutoTokenizer

    fake = tinker_fake()
    service = fake.FakeService()
    monkeypatch.setattr(tinker_backend, "_connect", lambda config: service)
    plan = write_plan(
        tmp_path,
        smollm2_model_dir,
        'name = "tinker"\nmodel = "Qwen/Qwen3-8B"\nlearning_rate = 0.5',
        "eval_fraction = 0.25",
    )
    monkeypatch.chdir(tmp_path)

    done = CliRunner().invoke(main, ["sft", str(plan)])

    assert done.exit_code == 0, done.output
    run_dir = tmp_path / done.output.splitlines()[0].removeprefix("run folder: ")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    *requests, (kind, scored) = service.training.requests
    assert [loss for loss, _ in requests] == ["cross_entropy"] * 4
    assert kind == "forward", "the held-out example is scored by a forward pass at the end"

    # Step 1 ran on the untrained table: its nll is the mean over the trained targets.
    table = fake.chain_table()
    im_end = AutoTokenizer.from_pretrained(str(smollm2_model_dir)).convert_tokens_to_ids(
        "<|im_end|>"
    )
    nll_terms = []
    for sent in requests[0][1]:
        inputs = sent.model_input.to_ints()
        targets = sent.loss_fn_inputs["target_tokens"].tolist()
        weights = sent.loss_fn_inputs["weights"].tolist()
        assert len(inputs) == len(targets) == len(weights)
        # The system and user turns carry no weight; the answer and its closing token do.
        assert weights[:10] == [0.0] * 10
        trained_targets = [t for t, w in zip(targets, weights, strict=True) if w > 0.0]
        assert trained_targets[-1] == im_end and len(trained_targets) >= 2
        logprobs = fake.bigram_logprobs(table, inputs, targets).tolist()
        nll_terms += [-lp for lp, w in zip(logprobs, weights, strict=True) if w > 0.0]
    trained = len(nll_terms)
    assert rows[0]["train/tokens"] == trained
    assert rows[0]["train/sequences"] == 2
    assert rows[0]["train/nll"] == pytest.approx(math.fsum(nll_terms) / trained, abs=1e-6)
    for (_, sent), row in zip(requests, rows, strict=True):
        weights = [w for d in sent for w in d.loss_fn_inputs["weights"].tolist() if w > 0.0]
        assert len(weights) == row["train/tokens"]
        assert weights == pytest.approx([1 / len(weights)] * len(weights))
        assert row["train/tinker/loss:sum"] == pytest.approx(row["train/nll"], abs=1e-5)
    assert service.training.saved_names, "save_every = 2 saves Tinker checkpoints"
    # The held-out example under the trained table: its answer and closing token are the
    # targets before the last (the newline after the closing token is not trained).
    (held_out,) = scored
    targets = held_out.loss_fn_inputs["target_tokens"].tolist()
    logprobs = fake.bigram_logprobs(
        service.training.table.detach(), held_out.model_input.to_ints(), targets
    ).tolist()
    answer = int(rows[-1]["eval/tokens"])
    assert targets[-2] == im_end and answer >= 2
    expected = math.fsum(-lp for lp in logprobs[-1 - answer : -1]) / answer
    assert rows[-1]["eval/nll"] == pytest.approx(expected, abs=1e-5)
    assert cut_steps(run_dir / "checkpoints") == [2, 4]
    checkpoints = [checkpoint_of(run_dir / "checkpoints", step) for step in (2, 4)]
    assert all((c / "trainer" / "tinker_state.json").is_file() for c in checkpoints)


def test_sft_steps_run_on_the_fireworks_trainers_cross_entropy_loss(
    smollm2_model_dir, tmp_path, monkeypatch
):
    from click.testing import CliRunner
    from rllm_core.cli import main
    from rllm_trainer_backend_fireworks import backend as fireworks_backend

    fake = fireworks_fake()
    service = fake.FakeService()
    monkeypatch.setattr(fireworks_backend, "_connect", lambda config: service)
    plan = write_plan(
        tmp_path,
        smollm2_model_dir,
        'name = "fireworks"\nmodel = "accounts/fireworks/models/qwen3-8b"',
    )
    monkeypatch.chdir(tmp_path)

    done = CliRunner().invoke(main, ["sft", str(plan)])

    assert done.exit_code == 0, done.output
    run_dir = tmp_path / done.output.splitlines()[0].removeprefix("run folder: ")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    requests = service.training.cross_entropy
    assert len(requests) == len(rows) == 4
    assert service.training.sent_inputs == [], "the custom-loss path is never used"
    assert service.training.steps == 4
    for (_, sent), row in zip(requests, rows, strict=True):
        trained = [
            t
            for d in sent
            for t, w in zip(
                d.loss_fn_inputs["target_tokens"].tolist(),
                d.loss_fn_inputs["weights"].tolist(),
                strict=True,
            )
            if w > 0.0
        ]
        assert row["train/tokens"] == len(trained)
        nll = math.fsum(-fake.logprob_of(t) for t in trained) / len(trained)
        # The fake answers float32 logprobs of large ids: equal to float32 precision.
        assert row["train/nll"] == pytest.approx(nll, rel=1e-6)
        assert row["train/fireworks/loss:sum"] == pytest.approx(nll, rel=1e-5)
