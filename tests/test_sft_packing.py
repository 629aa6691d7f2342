"""``rllm-core sft`` with ``[sft].packing`` on the torch backend trains exactly what it trains
without: the same examples packed into rows give every step the same NLL, token count and
gradient, so the weights after the run match (tiny random Llama over SmolLM2's tokenizer and
chat template, full training). The transcripts render to about 33 tokens each, so a batch of
six fills two 128-token rows of three examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference.cli_process import run_cli
from reference.run_cuts import checkpoint_of, cut_steps

ROOT = Path(__file__).resolve().parents[1]
TRANSCRIPTS = ROOT / "examples" / "sft-then-rl" / "arithmetic-sft.jsonl"


def write_plan(folder: Path, model: Path, *, packing: bool) -> Path:
    folder.mkdir()
    lines = TRANSCRIPTS.read_text().splitlines(keepends=True)[:12]
    (folder / "train.jsonl").write_text("".join(lines))
    plan = folder / "sft.toml"
    plan.write_text(
        f"""[run]
name = "packing"
seed = 0

[sft]
data = "train.jsonl"
epochs = 2
batch_size = 6
max_length = 128
packing = {json.dumps(packing)}

[trainer]
name = "torch"
model = "{model}"
device = "cpu"
learning_rate = 0.01
micro_batch_size = 2
lora = {{ rank = 0 }}

[renderer]
name = "chatml"
"""
    )
    return plan


def sft(plan: Path) -> Path:
    done = run_cli("sft", str(plan), "--json", cwd=plan.parent, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (plan.parent / "runs").iterdir()
    # --json: stdout is the summary object alone, with the run folder and summary paths.
    report = json.loads(done.stdout)
    assert report == json.loads((run_dir / "summary.json").read_text()) | {
        "run_folder": str(run_dir.relative_to(plan.parent)),
        "summary": str(run_dir.relative_to(plan.parent) / "summary.json"),
    }
    assert report["status"] == "finished" and report["kind"] == "sft"
    assert f"run folder: {report['run_folder']}" in done.stderr
    return run_dir


def final_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    checkpoint = checkpoint_of(run_dir / "checkpoints", cut_steps(run_dir / "checkpoints")[-1])
    tensors = {}
    for file in sorted((checkpoint / "trainer").glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_packed_sft_trains_as_unpacked(tiny_smol_model_dir: Path, tmp_path: Path):
    import torch

    runs = {
        packing: sft(write_plan(tmp_path / str(packing), tiny_smol_model_dir, packing=packing))
        for packing in (False, True)
    }
    rows = {
        packing: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for packing, run in runs.items()
    }
    assert [r["step"] for r in rows[True]] == [r["step"] for r in rows[False]] == [1, 2, 3, 4]
    for plain, packed in zip(rows[False], rows[True], strict=True):
        assert packed["train/nll"] == pytest.approx(plain["train/nll"], abs=1e-5)
        assert packed["train/tokens"] == plain["train/tokens"]
        assert packed["train/sequences"] == plain["train/sequences"] == 6.0
    for packing, run in runs.items():
        resolved = json.loads((run / "plan.resolved.json").read_text())
        assert resolved["plan"]["sft"]["packing"] is packing
    assert rows[False][-1]["train/nll"] < rows[False][0]["train/nll"]
    plain, packed = final_weights(runs[False]), final_weights(runs[True])
    assert plain.keys() == packed.keys() and plain
    for name, tensor in plain.items():
        torch.testing.assert_close(packed[name], tensor, atol=1e-5, rtol=0.0, msg=name)
