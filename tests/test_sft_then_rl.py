"""examples/sft-then-rl: sft.toml validates and its transcripts are current; two CI-sized steps
of it export a model folder that rl.toml names, and one step of rl.toml trains from it: the
RL run's first sampled tokens carry the exported model's logprobs, not the base model's, and
its ``[run].export`` writes the policy that step trained.

Both plans run as shipped from a copy of the example (with the task files beside it, as in
the repository), changed only in size: 16 transcripts in 2 steps, 2 tasks x 2 rollouts of 4
tokens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from reference.cli_process import overrides, plan_check, run_cli, run_folder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sft-then-rl"
TASKS = ROOT / "examples" / "tasks"
QUICKSTART = ROOT / "examples" / "quickstart" / "plan.toml"


def test_the_transcripts_file_is_current():
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "make_transcripts.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_plan_check_accepts_sft_toml():
    resolved = plan_check(EXAMPLE / "sft.toml", cwd=ROOT)
    sft = resolved["plan"]["sft"]
    assert sft["data"] == str(EXAMPLE / "arithmetic-sft.jsonl")
    assert sft["export"] == str(EXAMPLE / "runs" / "sft-model")
    components = {c["where"]: c for c in resolved["components"]}
    assert components["[trainer]"]["name"] == "torch"
    assert components["[trainer]"]["config"]["lora"]["rank"] > 0


def test_rl_toml_is_the_quickstart_from_the_sft_export():
    """rl.toml differs from the quickstart plan only in its name and model, and its model is
    the folder sft.toml exports to (both relative to the same folder)."""
    rl = tomllib.loads((EXAMPLE / "rl.toml").read_text())
    sft = tomllib.loads((EXAMPLE / "sft.toml").read_text())
    quickstart = tomllib.loads(QUICKSTART.read_text())
    assert (EXAMPLE / rl["trainer"].pop("model")).resolve() == (
        EXAMPLE / sft["sft"]["export"]
    ).resolve()
    quickstart["trainer"].pop("model")
    assert rl["run"].pop("name") == "sft-then-rl"
    quickstart["run"].pop("name")
    assert rl == quickstart
    assert sft["trainer"]["model"] == "smollm2-135m-instruct"


def _copy_example(root: Path) -> Path:
    """The example and the task files it reads, laid out as in the repository, with its
    transcripts cut to 16."""
    example = root / "examples" / "sft-then-rl"
    example.mkdir(parents=True)
    for name in ("sft.toml", "rl.toml"):
        shutil.copyfile(EXAMPLE / name, example / name)
    lines = (EXAMPLE / "arithmetic-sft.jsonl").read_text().splitlines(keepends=True)
    (example / "arithmetic-sft.jsonl").write_text("".join(lines[:16]))
    (root / "examples" / "tasks").mkdir()
    for name in ("arithmetic.jsonl", "arithmetic-eval.jsonl"):
        shutil.copyfile(TASKS / name, root / "examples" / "tasks" / name)
    return example


def _logprobs(model_dir: Path, datums: list[dict]) -> list[list[float]]:
    """Each datum's logprobs at its action tokens under the model in ``model_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for datum in datums:
            ids = torch.tensor([datum["token_ids"]])
            logits = model(input_ids=ids).logits[0, :-1].float()
            picked = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
            positions = [i for i, m in enumerate(datum["action_mask"]) if m]
            out.append([float(picked[i - 1]) for i in positions])
    return out


def test_rl_trains_from_the_model_sft_exported(smollm2_model_dir, tmp_path):
    example = _copy_example(tmp_path)
    sft = run_cli(
        "sft",
        str(example / "sft.toml"),
        "--quiet",
        *overrides(
            "sft.batch_size=8",
            "sft.epochs=1",
            "sft.eval_fraction=0.0",
            "trainer.learning_rate=2e-3",
        ),
        cwd=tmp_path,
        timeout=300,
        columns=200,
    )
    assert sft.returncode == 0, sft.stderr[-3000:]
    sft_dir = run_folder(sft, tmp_path, "sft-arithmetic")
    summary = json.loads((sft_dir / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("finished", 2)
    exported = example / "runs" / "sft-model"
    assert (exported / "config.json").is_file()
    assert (exported / "tokenizer.json").is_file()

    rl = run_cli(
        "run",
        str(example / "rl.toml"),
        "--plain",
        "--record-datums",
        *overrides(
            "run.steps=1",
            "run.save_every=0",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
            "sampling.max_tokens=4",
            f'run.export="{tmp_path / "rl-model"}"',
            # The entropy bonus moves the weights even when every reward of the step is equal.
            "algorithm.entropy_coef=0.5",
        ),
        cwd=tmp_path,
        timeout=300,
        columns=200,
    )
    assert rl.returncode == 0, rl.stderr[-3000:]
    rl_dir = run_folder(rl, tmp_path, "sft-then-rl")
    rl_summary = json.loads((rl_dir / "summary.json").read_text())
    assert rl_summary["export"] == str(tmp_path / "rl-model")
    assert f"exported the trained model to {tmp_path / 'rl-model'}" in rl.stdout + rl.stderr
    resolved = json.loads((rl_dir / "plan.resolved.json").read_text())
    configs = {c["where"]: c["config"] for c in resolved["components"]}
    assert Path(configs["[trainer]"]["model"]).resolve() == exported.resolve()
    assert Path(configs["[renderer]"]["tokenizer"]).resolve() == exported.resolve()

    datums = [json.loads(line) for line in (rl_dir / "datums.jsonl").read_text().splitlines()]
    assert datums
    sampled = [
        [lp for lp, m in zip(d["logprobs"], d["action_mask"], strict=True) if m] for d in datums
    ]
    from_export = _logprobs(exported, datums)
    from_base = _logprobs(smollm2_model_dir, datums)
    for rollout, mine in zip(sampled, from_export, strict=True):
        assert rollout == pytest.approx(mine, abs=2e-3)
    gap = max(
        abs(a - b)
        for rollout, theirs in zip(sampled, from_base, strict=True)
        for a, b in zip(rollout, theirs, strict=True)
    )
    assert gap > 0.05, "the SFT steps left the model indistinguishable from the base model"
    # [run].export wrote the policy after the RL step: the step's LoRA update merged in.
    trained = _logprobs(tmp_path / "rl-model", datums)
    moved = max(
        abs(a - b)
        for ours, theirs in zip(trained, from_export, strict=True)
        for a, b in zip(ours, theirs, strict=True)
    )
    assert moved > 0, "[run].export wrote the model the RL run started from"
