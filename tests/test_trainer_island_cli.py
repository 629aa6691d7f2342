"""`rllm-core run PLAN --role trainer` with `[scheduler].launcher = "local-process"`, as a user
starts it: the process only schedules, launches the incarnation as `rllm-core run PLAN --role
trainer --incarnation 1`, which writes its output to `island/trainer-1.log` in the scheduler's
run folder and trains the batches a sampler left in the object store (``test_trainer_role``'s
batches, on the tiny model); the journal records the job's lifecycle. `--incarnation` without
`--role trainer` is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_trainer_role

from rllm_core.run.cuts import latest_cut
from rllm_object_store_file.objects import FileObjectStore
from test_trainer_role import AGE, BATCH, GROUP, NAME, SEED, Batches, journal

STEPS = 2


def write_plan(root: Path, model: Path) -> Path:
    tasks = root / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"task_id": f"t{i}", "question": f"What is {i} + 2?", "answer": str(i + 2)})
            + "\n"
            for i in range(4)
        )
    )
    plan = root / "plan.toml"
    plan.write_text(
        f"""
[run]
name = "{NAME}"
seed = {SEED}
steps = {STEPS}
pipeline = "async"

[algorithm]
loss = "reinforce"
advantage = "grpo"
group_size = {GROUP}
batch_size = {BATCH}
max_policy_age = {AGE}

[sampling]
max_tokens = 4

[trainer]
name = "torch"
model = "{model}"
device = "cpu"
learning_rate = 0.01
micro_batch_size = 2
lora = {{ rank = 4, alpha = 8 }}

[renderer]
name = "chatml"

[harness]
name = "single-turn"

[tasks]
name = "jsonl"
path = "{tasks}"
reward = "numeric"

[trace_store]
name = "deltachain"

[sandbox]
name = "local"

[object_store]
name = "file"
root = "{root / "store"}"

[scheduler]
launcher = "local-process"
ready_timeout_s = 120
poll_s = 0.05
"""
    )
    return plan


def rllm_core(*args: str, cwd: Path, timeout: float) -> tuple[int, str]:
    """Run ``rllm-core run ARGS``; its exit status and output. The processes it launched share
    its session, and end with it when it times out."""
    process = subprocess.Popen(
        [sys.executable, "-m", "rllm_core.cli", "run", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        raise AssertionError(f"timed out after {timeout} s:\n{out[-3000:]}") from None
    return process.returncode, out


@pytest.mark.slow  # two processes that build the model: about 15 s on a loaded 2-core machine
def test_the_trainer_role_launches_its_incarnation_as_a_process(tiny_smol_model_dir, tmp_path):
    plan = write_plan(tmp_path, tiny_smol_model_dir)
    store = FileObjectStore(tmp_path / "store")
    batches = Batches(store)
    for step in range(1, STEPS + 1):
        batches.produce(step)

    code, out = rllm_core(str(plan), "--plain", "--role", "trainer", cwd=tmp_path, timeout=120)
    folders = [p for p in (tmp_path / "runs").iterdir() if (p / "island").is_dir()]
    logs = "".join(p.read_text()[-3000:] for f in folders for p in (f / "island").glob("*.log"))
    assert code == 0, out[-3000:] + logs
    assert [
        (r["kind"], r["incarnation"], r.get("trigger") or r.get("reason"))
        for r in journal(store)
        if r["kind"] in ("started", "launched", "ready", "released", "stopped", "failed")
    ] == [
        ("started", 1, None),
        ("launched", 1, None),
        ("ready", 1, None),
        ("released", 1, "stopped"),
        ("stopped", 1, "final"),
    ], logs
    (folder,) = folders
    assert "cut 0000000002-000001 (final)" in (folder / "island" / "trainer-1.log").read_text()
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["role"], summary["incarnation"], summary["status"]) == (
        "trainer",
        1,
        "finished",
    )
    final = latest_cut(store, f"runs/{NAME}")
    assert final is not None
    assert (final.step, final.trigger) == (STEPS, "final")


def test_an_incarnation_without_the_trainer_role_is_refused(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text("[run]\n")
    code, out = rllm_core(str(plan), "--incarnation", "2", cwd=tmp_path, timeout=60)
    assert code == 2, out
    assert "--incarnation 2 is one trainer incarnation: use it with --role trainer" in out
