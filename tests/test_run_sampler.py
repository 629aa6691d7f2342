"""`rllm-core run` with `[sampler] name = "vllm"` against the fake vLLM server: the servers follow
the policy after every optimizer step, every trace carries the version that served it, a reload
that keeps failing fails the run, a restarted server gets its weights back."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from reference.cli_process import run_cli, run_folder
from reference.quickstart import write_tasks
from rllm_core.rollout.sessions import SessionKey
from rllm_core.testing.fakevllm import FakeVllmServer, version_of

QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


@pytest.fixture(scope="module")
def model_dir(tiny_smol_model_dir: Path) -> Path:
    return tiny_smol_model_dir


def arithmetic_reply(model_dir: Path, on_reply: Any = None) -> Any:
    """Replies to "What is a + b?" with the right sum on every third completion and a wrong
    one otherwise, so that groups have varied rewards and every step trains."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    counter = itertools.count()
    lock = threading.Lock()

    def reply(prompt: list[int], max_tokens: int, stops: list[int]) -> list[int]:
        with lock:
            index = next(counter)
        if on_reply is not None:
            on_reply(index)
        found = QUESTION.findall(tokenizer.decode(prompt))
        a, b = (int(v) for v in found[-1]) if found else (0, 0)
        answer = a + b if index % 3 == 0 else a + b + 1
        return (tokenizer.encode(str(answer), add_special_tokens=False) + stops[:1])[:max_tokens]

    return reply


def write_plan(folder: Path, model_dir: Path, url: str, *, steps: int = 3, rank: int = 4) -> Path:
    tasks, held_out = write_tasks(folder)
    lora = f"lora = {{ rank = {rank}, alpha = {2 * rank}.0 }}" if rank else "lora = { rank = 0 }"
    plan = folder / "plan.toml"
    plan.write_text(
        f"""
[run]
name = "served"
seed = 0
steps = {steps}

[algorithm]
loss = {{ name = "dppo-tv", delta = 0.15 }}
advantage = {{ name = "grpo", normalize_std = true }}
group_size = 4
batch_size = 2

[sampling]
temperature = 1.0
max_tokens = 6

[trainer]
name = "torch"
model = "{model_dir}"
device = "cpu"
learning_rate = 1e-2
{lora}

[sampler]
name = "vllm"
urls = ["{url}"]
weights_dir = "{folder / "weights"}"
retries = 2
retry_backoff_s = 0.05
retry_backoff_max_s = 0.1
health_interval_s = 0.2

[renderer]
name = "chatml"

[harness]
name = "single-turn"
system_prompt = "Answer with the number only."

[tasks]
name = "jsonl"
path = "{tasks}"
eval_path = "{held_out}"
reward = "numeric"

[trace_store]
name = "deltachain"
"""
    )
    return plan


def trace_versions(run_dir: Path) -> dict[int, list[int]]:
    """The weight version of every trace of the run, by the step that sampled it."""
    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    store = DeltaChainTraceStore(run_dir / "traces")
    by_step: dict[int, list[int]] = {}
    try:
        for session in store.sessions():
            key = SessionKey.parse(session, run=run_dir.name)
            assert key is not None, session
            for trace in store.session(session):
                by_step.setdefault(key.step, []).append(trace.record.weight_version)
    finally:
        store.close()
    return by_step


def assert_each_step_sampled_the_previous_policy(run_dir: Path, server: FakeVllmServer) -> None:
    """Step k of a 3-step run sampled from the policy after step k - 1, and the server (which
    reads the adapter named, or its own reloaded version) served every traced call with it."""
    by_step = trace_versions(run_dir)
    assert {step: set(versions) for step, versions in by_step.items()} == {
        1: {0},
        2: {1},
        3: {2},
    }
    traced = Counter(v for versions in by_step.values() for v in versions)
    assert traced == Counter(s.version for s in server.completions)


def loaded_versions(server: FakeVllmServer) -> list[int | None]:
    return [
        version_of(payload["lora_path"])
        for path, payload in server.calls
        if path == "/v1/load_lora_adapter"
    ]


def run(plan: Path, cwd: Path) -> Any:
    return run_cli("run", str(plan), "--plain", cwd=cwd, timeout=240, columns=200)


@pytest.mark.parametrize("rank", [4, 0], ids=["lora", "full"])
def test_the_servers_follow_every_optimizer_step_and_traces_carry_the_served_version(
    model_dir, tmp_path, rank
):
    with FakeVllmServer(reply=arithmetic_reply(model_dir)) as server:
        plan = write_plan(tmp_path, model_dir, server.url, rank=rank)
        result = run(plan, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "served")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["weight_version"] for m in metrics] == [1.0, 2.0, 3.0]
    assert all(m["trained"] == 1.0 for m in metrics)
    # Each step's rollouts follow one more weight update: version 0, then one per step.
    assert [m["vllm/weight_syncs"] for m in metrics] == [1.0, 2.0, 3.0]
    assert [m["vllm/restores"] for m in metrics] == [0.0, 0.0, 0.0]
    seconds = [m["vllm/sync_s"] for m in metrics]
    assert 0 < seconds[0] < seconds[1] < seconds[2], seconds
    if rank:
        # Version 0 before the first rollout, then one after every optimizer step.
        assert loaded_versions(server) == [0, 1, 2, 3]
        assert server.loaded()[-1] == "policy-v3"
    else:
        reloads = [
            version_of(payload["kwargs"]["weights_path"])
            for path, payload in server.calls
            if path == "/collective_rpc" and payload["method"] == "reload_weights"
        ]
        assert reloads == [0, 1, 2, 3]
        assert (server.pauses, server.paused, server.version_tag) == (4, False, "3")
        assert server.weight_version == 3
        assert server.served_on_stale_cache == 0
    assert_each_step_sampled_the_previous_policy(run_dir, server)
    # The export folders the servers moved past are gone: the last two stay.
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished"


def test_a_reload_that_keeps_failing_fails_the_run_naming_the_server(model_dir, tmp_path):
    server = FakeVllmServer()

    def fail_loads_from_now(index: int) -> None:
        if index == 0:  # version 0 is loaded; every later load fails
            server.fail_next_loads(100, status=500, message="CUDA out of memory")

    server.reply = arithmetic_reply(model_dir, on_reply=fail_loads_from_now)
    with server:
        plan = write_plan(tmp_path, model_dir, server.url)
        result = run(plan, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "served")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["last_step"] == 0
    reason = summary["reason"]
    assert reason.startswith("UpstreamError: ")
    assert server.url in reason
    assert "loading adapter 'policy-v1'" in reason and "CUDA out of memory" in reason
    assert server.url in result.stderr
    # The first load and three tries of the second (retries = 2).
    assert loaded_versions(server) == [0, 1, 1, 1]


def test_a_restarted_server_gets_its_adapter_back_and_the_run_finishes(model_dir, tmp_path):
    server = FakeVllmServer(reply=arithmetic_reply(model_dir))
    with server:

        def restart_after_the_first_step() -> None:
            deadline = time.monotonic() + 120
            while server.loads < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            server.restart(down_s=0.3)

        watcher = threading.Thread(target=restart_after_the_first_step, daemon=True)
        watcher.start()
        plan = write_plan(tmp_path, model_dir, server.url)
        result = run(plan, tmp_path)
        watcher.join(timeout=5)
    assert result.returncode == 0, result.stderr[-3000:]
    assert server.restarts == 1
    run_dir = run_folder(result, tmp_path, "served")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["vllm/restores"] for m in metrics] == [0.0, 1.0, 1.0]
    loads = loaded_versions(server)
    # Version 1 was loaded again after the restart, before the run went on.
    assert loads.count(1) == 2 and loads[-1] == 3, loads
    by_step = trace_versions(run_dir)
    assert set(by_step[2]) == {1}
    assert Counter(v for vs in by_step.values() for v in vs) == Counter(
        s.version for s in server.completions
    )


def test_async_runs_and_evaluations_sample_from_the_servers_on_the_policy(model_dir, tmp_path):
    with FakeVllmServer(reply=arithmetic_reply(model_dir)) as server:
        plan = write_plan(tmp_path, model_dir, server.url)
        plan.write_text(
            plan.read_text()
            .replace("steps = 3\n", 'steps = 3\npipeline = "async"\n')
            .replace("batch_size = 2\n", "batch_size = 2\nmax_policy_age = 1\n")
        )
        result = run(plan, tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        run_dir = run_folder(result, tmp_path, "served")
        assert loaded_versions(server) == [0, 1, 2, 3]
        by_step = trace_versions(run_dir)
        # Batch k may run ahead of step k - 1 by one version, never more.
        for step, versions in by_step.items():
            assert set(versions) <= {step - 2, step - 1}, (step, versions)
        assert Counter(v for vs in by_step.values() for v in vs) == Counter(
            s.version for s in server.completions
        )
        served_before = len(server.completions)

        checkpoint = run_dir  # its latest checkpoint
        evaluated = run_cli(
            "eval", str(plan), "--checkpoint", str(checkpoint), "--plain", cwd=tmp_path, timeout=240
        )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    # The evaluation exported the checkpoint's weights to the servers and sampled from them.
    assert loaded_versions(server)[4:] == [3]
    assert {s.version for s in server.completions[served_before:]} == {3}


def run_roles(plan: Path, cwd: Path, **extra: list[str]) -> dict[str, str]:
    """`rllm-core run PLAN --role sampler` and `--role trainer` side by side (``extra``: more
    arguments of a role), both waited for and both required to exit 0; their outputs."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "rllm_core.cli", "run", str(plan), "--plain", "--role"]
    roles = {
        role: subprocess.Popen(
            [*command, role, *extra.get(role, [])],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for role in ("sampler", "trainer")
    }
    try:
        outputs = {role: process.communicate(timeout=240)[0] for role, process in roles.items()}
    finally:
        for process in roles.values():
            if process.poll() is None:
                process.kill()
    for role, process in roles.items():
        assert process.returncode == 0, (role, outputs[role][-3000:])
    return outputs


def test_a_sampler_role_exports_each_release_it_loads_to_the_servers(model_dir, tmp_path):
    with FakeVllmServer(reply=arithmetic_reply(model_dir)) as server:
        plan = write_plan(tmp_path, model_dir, server.url)
        plan.write_text(
            plan.read_text()
            .replace("steps = 3\n", 'steps = 3\npipeline = "async"\n')
            .replace("batch_size = 2\n", "batch_size = 2\nmax_policy_age = 1\n")
            + f'\n[object_store]\nname = "file"\nroot = "{tmp_path / "store"}"\n'
            + "\n[scheduler]\npoll_s = 0.1\nidle_stop_s = 600\n"
        )
        outputs = run_roles(plan, tmp_path)
    loads = loaded_versions(server)
    # The untrained policy first, then the releases the sampler loaded, in order; it loads at
    # least version 1 before batch 3 (one batch ahead at most).
    assert loads[0] == 0 and loads == sorted(set(loads)) and 1 in loads, loads
    sampler_dir = Path(outputs["sampler"].splitlines()[0].removeprefix("run folder: "))
    by_step = trace_versions(tmp_path / sampler_dir)
    assert Counter(v for vs in by_step.values() for v in vs) == Counter(
        s.version for s in server.completions
    )
    assert set(by_step[1]) == {0}


@pytest.mark.parametrize("example", ["tinker-modal", "fireworks-daytona"])
def test_plan_check_refuses_the_vllm_sampler_with_a_managed_trainer_naming_both(example, tmp_path):
    shipped = Path(__file__).resolve().parents[1] / "examples" / example / "plan.toml"
    plan = shipped.parent / f".sampler-check-{tmp_path.name}.toml"
    sampler = '[sampler]\nname = "vllm"\nurls = ["http://127.0.0.1:9"]\nweights_dir = "w"\n'
    plan.write_text(shipped.read_text(encoding="utf-8") + "\n" + sampler, encoding="utf-8")
    try:
        done = run_cli("plan", "check", str(plan), cwd=tmp_path)
    finally:
        plan.unlink()
    trainer = example.split("-")[0]
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"[sampler].name: sampler 'vllm' needs weights exported by the trainer; trainer backend"
        f" '{trainer}' cannot export them" in " ".join((done.stdout + done.stderr).split())
    )
