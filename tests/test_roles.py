"""`rllm-core run --role sampler` and `--role trainer` as two processes on the quickstart plan,
sharing only an object store: they make progress together, and a trainer killed with SIGKILL
and started again loses no batch and trains none twice.

The two-process runs train the tiny random Llama over SmolLM2's tokenizer: what they check is
how the processes share the run, which does not depend on what the model answers. The sampler
starts its rounds at least a second apart (``min_round_s``), so that the trainer, which trains
a step in milliseconds, is still waiting for a batch when the test kills it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reference.cli_process import overrides
from reference.quickstart import PLAN, write_tasks

STEPS = 4


def _plan(tmp_path: Path, store_section: str, model: Path | None = None) -> Path:
    tasks, _ = write_tasks(tmp_path)
    plan = tmp_path / "plan.toml"
    # A split run does not evaluate during the run (plan check refuses eval_every with an
    # [object_store]).
    text = (
        PLAN.read_text().replace("eval_every = 5\n", "").replace('keep_best = "eval/pass@1"\n', "")
    )
    if model is not None:
        text = text.replace('model = "smollm2-135m-instruct"', f'model = "{model}"')
    plan.write_text(
        text.replace('path = "../tasks/arithmetic.jsonl"', f'path = "{tasks}"')
        + store_section
        + "\n[scheduler]\npoll_s = 0.2\nidle_stop_s = 600\nmin_round_s = 1.0\n"
    )
    return plan


def _start(
    plan: Path, role: str, cwd: Path, log: Path, *, json_out: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start one role writing stdout and stderr to ``log``; with ``json_out``, with ``--json``
    and its stdout (the summary object) there instead."""
    args = overrides(
        'run.pipeline="async"',
        f"run.steps={STEPS}",
        "run.save_every=1",
        "algorithm.max_policy_age=1",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        "sampling.max_tokens=4",
        f'tasks.eval_path="{cwd / "held-out.jsonl"}"',
    )
    command = [sys.executable, "-m", "rllm_core.cli", "run", str(plan), "--plain"]
    command += ["--role", role, *args, *(["--json"] if json_out is not None else [])]
    with open(log, "ab") as out, open(json_out or os.devnull, "wb") as summary:
        return subprocess.Popen(
            command,
            cwd=cwd,
            stdout=summary if json_out is not None else out,
            stderr=out if json_out is not None else subprocess.STDOUT,
            env=dict(os.environ, COLUMNS="200"),
        )


def _metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(log.read_text()[-4000:]) from None
    assert code == 0, log.read_text()[-4000:]


def _folder(process: subprocess.Popen[bytes], log: Path, cwd: Path) -> Path:
    """The run folder ``process`` names on its first line."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        first = log.read_text().split("\n", 1)[0] if log.is_file() else ""
        if first.startswith("run folder: ") and "\n" in log.read_text():
            return cwd / first.removeprefix("run folder: ")
        assert process.poll() is None, log.read_text()[-4000:]
        time.sleep(0.05)
    raise AssertionError(f"no run folder in {log}")


def _run_split(tmp_path: Path, store_section: str, model: Path) -> None:
    plan = _plan(tmp_path, store_section, model)
    logs = tmp_path / "logs"
    logs.mkdir()
    sampler = _start(plan, "sampler", tmp_path, logs / "sampler.log")
    try:
        trainer = _start(plan, "trainer", tmp_path, logs / "trainer-1.log")
        first = _folder(trainer, logs / "trainer-1.log", tmp_path)
        deadline = time.monotonic() + 240
        while len(_metrics(first)) < 2:
            assert trainer.poll() is None, (logs / "trainer-1.log").read_text()[-4000:]
            assert time.monotonic() < deadline, (logs / "trainer-1.log").read_text()[-4000:]
            time.sleep(0.05)
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait()
        killed_after = [m["step"] for m in _metrics(first)]
        trainer = _start(plan, "trainer", tmp_path, logs / "trainer-2.log")
        second = _folder(trainer, logs / "trainer-2.log", tmp_path)
        _wait(trainer, logs / "trainer-2.log", 300)
        _wait(sampler, logs / "sampler.log", 60)
    finally:
        for process in (sampler, trainer):
            if process.poll() is None:
                process.kill()
    for line in _metrics(first) + _metrics(second):
        assert 0 < line["time/step_s"] < 300, line  # timed from the incarnation's start
    resumed = [m["step"] for m in _metrics(second)]
    assert resumed and resumed[-1] == STEPS, resumed
    # The second incarnation restored the newest cut (every step is cut) and went on from it:
    # the batches up to that cut were trained once, by the first trainer, and the rest once,
    # by the second; a step the first trained after its last cut is trained again.
    restored = resumed[0] - 1
    assert killed_after[:restored] == list(range(1, restored + 1))
    assert restored >= 1 and restored <= killed_after[-1]
    assert resumed == list(range(restored + 1, STEPS + 1))
    log = (logs / "trainer-2.log").read_text()
    assert "restored cut" in log and f"(step {restored})" in log
    episodes = [json.loads(line) for line in (second / "episodes.jsonl").read_text().splitlines()]
    assert sorted({e["step"] for e in episodes}) == resumed
    summary = json.loads((second / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["last_step"] == STEPS


def test_sampler_and_trainer_over_a_directory_store(tiny_smol_model_dir, tmp_path):
    store = tmp_path / "store"
    _run_split(
        tmp_path, f'\n[object_store]\nname = "file"\nroot = "{store}"\n', tiny_smol_model_dir
    )
    assert (store / "objects" / "runs" / "quickstart" / "tickets").is_dir()


def test_sampler_and_trainer_over_s3(tiny_smol_model_dir, tmp_path, s3_server, s3_bucket):
    keys = s3_server.store_config(s3_bucket, prefix="shared")
    section = '\n[object_store]\nname = "s3"\n' + "".join(
        f"{key} = {json.dumps(value)}\n" for key, value in keys.items()
    )
    _run_split(tmp_path, section, tiny_smol_model_dir)


def test_a_trainer_that_cannot_start_gives_up_after_max_failures(smollm2_model_dir, tmp_path):
    """Every incarnation fails to read the newest cut; the scheduler gives up with exit 3."""
    from rllm_core.training.pipeline import Ticket
    from rllm_core.training.shared import SharedRun
    from rllm_object_store_file.objects import FileObjectStore

    store_root = tmp_path / "store"
    shared = SharedRun(FileObjectStore(store_root), "quickstart")
    # Two batches wait: all that max_policy_age = 1 lets wait, where the trainer starts.
    for step in (1, 2):
        shared.put_ticket(
            Ticket(step=step, first=4 * (step - 1), count=4, groups=2, data={}, rollout={})
        )
    shared.store.put(shared.key("cuts", "LATEST"), b"written by something else")
    plan = _plan(tmp_path, f'\n[object_store]\nname = "file"\nroot = "{store_root}"\n')
    plan.write_text(plan.read_text() + "max_failures = 2\n")
    log = tmp_path / "trainer.log"
    out = tmp_path / "trainer.json"
    trainer = _start(plan, "trainer", tmp_path, log, json_out=out)
    code = trainer.wait(timeout=180)
    text = log.read_text()
    assert code == 3, text[-4000:]
    assert "failed 2 times in a row without training a round" in text
    assert "is not a CutRef" in text
    # --json: the summary the trainer wrote is stdout's one object, the errors are on stderr.
    report = json.loads(out.read_text())
    run_dir = tmp_path / report["run_folder"]
    assert report == json.loads((run_dir / "summary.json").read_text()) | {
        "run_folder": report["run_folder"],
        "summary": str(Path(report["run_folder"]) / "summary.json"),
    }
    assert report["status"] == "failed" and report["role"] == "trainer"
    journal = shared.store.list(shared.key("scheduler") + "/")
    records = [json.loads(shared.store.get(key)) for key in journal]
    failed = [r for r in records if r["kind"] == "failed"]
    assert [r["incarnation"] for r in failed] == [1, 2], records
    assert records[-1]["kind"] == "gave-up"


def test_a_sampler_that_cannot_load_a_release_fails_instead_of_waiting(smollm2_model_dir, tmp_path):
    """The trainer reports a version whose release is not in the store: the sampler, which
    waits for that trainer at its age bound, ends with the error instead of waiting forever."""
    from rllm_core.training.shared import SharedRun
    from rllm_object_store_file.objects import FileObjectStore

    store_root = tmp_path / "store"
    plan = _plan(tmp_path, f'\n[object_store]\nname = "file"\nroot = "{store_root}"\n')
    log = tmp_path / "sampler.log"
    sampler = _start(plan, "sampler", tmp_path, log)
    try:
        deadline = time.monotonic() + 240
        while "batch 2 queued" not in (log.read_text() if log.is_file() else ""):
            assert sampler.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.1)
        SharedRun(FileObjectStore(store_root), "quickstart").put_progress(1, 1)
        code = sampler.wait(timeout=60)
    finally:
        if sampler.poll() is None:
            sampler.kill()
    text = log.read_text()
    assert code == 1, text[-4000:]
    assert "no release under" in text and "releases/LATEST" in text
