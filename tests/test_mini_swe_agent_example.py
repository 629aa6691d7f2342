"""examples/mini-swe-agent/plan.toml for one step, its model replaced by a scripted fake.

The plan runs as shipped except for its size (one task, 2 rollouts) and its model: a tiny
random Llama over SmolLM2's tokenizer trains, and the rollouts sample from a fake vLLM server
(``[sampler] name = "vllm"``) that answers in mini-swe-agent's text action format. Of the two
rollouts, one solves the shipped ``hello-file`` task in a real bubblewrap sandbox and submits,
the other submits at once; so the group has rewards 1 and 0, and both episodes train as one
datum each.

Stopped by Ctrl-C while that step trains (made long with many epochs), the run ends within
30 s, and within 5 s of a second Ctrl-C.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from reference.cli_process import run_cli, run_folder, vllm_group_overrides
from rllm_core.testing.fakevllm import FakeVllmServer
from rllm_core.types import Termination

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "mini-swe-agent" / "plan.toml"
TASK = ROOT / "examples" / "tasks" / "shell" / "hello-file"
SOLVE = "printf 'Hello, world!\\n' > /app/hello.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def agent_replies(tiny_smol_long_model_dir: Path) -> Any:
    """The fake model: a first turn alternates between solving (then submitting on the next
    turn) and submitting at once; later turns (the prompt holds an observation) submit."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_smol_long_model_dir))
    first_turns = itertools.count()
    lock = threading.Lock()

    def reply(prompt: list[int], max_tokens: int, stops: list[int]) -> list[int]:
        observed = tokenizer.decode(prompt).count("<returncode>")
        if observed:
            command = SUBMIT
        else:
            with lock:
                command = SOLVE if next(first_turns) % 2 == 0 else SUBMIT
        text = f"THOUGHT: one step.\n\n```mswea_bash_command\n{command}\n```"
        return (tokenizer.encode(text, add_special_tokens=False) + stops[:1])[:max_tokens]

    return reply


def test_one_step_of_the_example_trains_a_solved_and_an_unsolved_episode(
    tiny_smol_long_model_dir, tmp_path
):
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap("run this plan")
    with FakeVllmServer(reply=agent_replies(tiny_smol_long_model_dir)) as server:
        result = run_cli(
            "run",
            str(PLAN),
            "--plain",
            "--record-datums",
            *vllm_group_overrides(
                tiny_smol_long_model_dir,
                server.url,
                tmp_path,
                TASK,
                "run.steps=1",
                "sampling.max_tokens=64",
            ),
            cwd=tmp_path,
            timeout=240,
            columns=200,
        )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "mini-swe-agent")

    episodes = sorted(read_jsonl(run_dir / "episodes.jsonl"), key=lambda e: e["reward"])
    assert [Termination(e["termination"]) for e in episodes] == [Termination.DONE] * 2
    assert [e["reward"] for e in episodes] == [0.0, 1.0]
    # The quitter submitted on its first turn, the solver on its second; one lineage each.
    assert [[len(t["trace_ids"]) for t in e["trajectories"]] for e in episodes] == [[1], [2]]

    (metrics,) = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics["episodes"] == 2.0 and metrics["infra_failures"] == 0.0
    assert metrics["trained"] == 1.0
    # The agent writes its actions as text: no tool call, well-formed or not.
    assert (metrics["tools/calls"], metrics["tools/invalid"]) == (0.0, 0.0)
    datums = read_jsonl(run_dir / "datums.jsonl")
    assert sorted(d["episode_id"] for d in datums) == sorted(e["episode_id"] for e in episodes)
    assert len(server.completions) == 3


def start_stoppable(
    tiny_smol_long_model_dir: Path, server: FakeVllmServer, cwd: Path
) -> subprocess.Popen[str]:
    """The example as above with a step whose training takes minutes: 2000 epochs, each an
    optimizer step and a weight sync."""
    args = vllm_group_overrides(
        tiny_smol_long_model_dir,
        server.url,
        cwd,
        TASK,
        "run.steps=1",
        "algorithm.epochs=2000",
        "sampling.max_tokens=64",
    )
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "rllm_core.cli", "run", str(PLAN), "--plain", *args],
        cwd=cwd,
        env=dict(os.environ, COLUMNS="200"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_training(server: FakeVllmServer, run: subprocess.Popen[str]) -> None:
    """Until the rollouts' three completions were served and training has begun (the fake
    server was given the policy of a first optimizer step)."""
    deadline = time.monotonic() + 180
    while len(server.completions) < 3 or not any(n.endswith("-v1") for n in server.loaded()):
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the step's training did not begin within 180 s"
        time.sleep(0.2)


def drain(run: subprocess.Popen[str]) -> tuple[list[str], list[str], threading.Event]:
    """Read the run's stdout and stderr into lists as it writes them; the event is set when
    it says it is stopping."""
    out: list[str] = []
    err: list[str] = []
    stopping = threading.Event()

    def read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)
            if "stopping: " in line:
                stopping.set()

    for stream, into in ((run.stdout, out), (run.stderr, err)):
        threading.Thread(target=read, args=(stream, into), daemon=True).start()
    return out, err, stopping


@pytest.mark.parametrize("signals", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_while_the_agent_step_trains_stops_the_run_with_its_summary(
    tiny_smol_long_model_dir, tmp_path, signals
):
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap("run this plan")
    with FakeVllmServer(reply=agent_replies(tiny_smol_long_model_dir)) as server:
        run = start_stoppable(tiny_smol_long_model_dir, server, tmp_path)
        try:
            wait_for_training(server, run)
            out_lines, err_lines, stopping = drain(run)
            run.send_signal(signal.SIGINT)
            if signals == 2:
                # The second signal while the first one's cleanup runs, as a user presses
                # Ctrl-C again: right after the run says it is stopping (a fixed pause could
                # outlast a quick cleanup).
                assert stopping.wait(30), "the run never said it was stopping"
                run.send_signal(signal.SIGINT)
            sent = time.monotonic()
            run.wait(timeout=60)
            took = time.monotonic() - sent
        finally:
            run.kill()
    out, err = "".join(out_lines), "".join(err_lines)
    assert run.returncode == 130, err[-3000:]
    assert took <= (5.0 if signals == 2 else 30.0), (took, err[-3000:])
    run_dir = tmp_path / out.splitlines()[0].removeprefix("run folder: ")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["last_step"]) == ("interrupted", 0)
    # The step was not recorded, and the weights its epochs moved were not saved.
    assert not (run_dir / "metrics.jsonl").is_file() or not read_jsonl(run_dir / "metrics.jsonl")
    assert not (run_dir / "checkpoints").is_dir() or not any((run_dir / "checkpoints").iterdir())
    if signals == 1:
        assert "step 1: training interrupted; the step is not recorded" in out
    else:
        assert "second signal: exiting within 5 s" in out
