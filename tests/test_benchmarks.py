"""The async pipeline benchmark's script answers --help, and its fake remote trainer keeps the
contracts the benchmark relies on: waits without computing, reports the weight version each
sample call started with, and registers as a backend that publishes weights. The scheduler
simulation runs a short trace and accounts for every group. The shell SFT-then-RL benchmark
builds a transcript of every train task's solution that earns reward 1 through the harness."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from rllm_core.plugins import PluginManager
from rllm_core.ports import Sampler, TrainerBackend
from rllm_core.types import Datum, SampleRequest, SamplingParams

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
STOP = 2


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(
    script: str, *args: str | Path, timeout: int = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _answers_help(script: str, *options: str) -> None:
    stdout = _run(script, "--help").stdout
    for option in options:
        assert option in stdout


@pytest.fixture(scope="module")
def remote_fake() -> ModuleType:
    return _load("remote_fake")


def test_async_pipeline_script_answers_help() -> None:
    _answers_help("async_pipeline.py", "--json", "--cases", "--steps", "--ages", "--output-dir")


def test_remote_fake_registers_a_backend_that_publishes_weights(
    remote_fake: ModuleType, smollm2_tokenizer_dir: Path
) -> None:
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(remote_fake, name="remote-fake", distribution="rllm-benchmarks")
    spec = pm.get("trainer_backend", "remote-fake")
    assert spec.trait("publishes_weights") is True
    backend = spec.build({"model": str(smollm2_tokenizer_dir), "forward_backward_s": 0.0})
    assert isinstance(backend, TrainerBackend)
    assert isinstance(backend.sampler(), Sampler)


def _request(backend: object, question: str, seed: int) -> SampleRequest:
    ids = backend._tokenizer.encode(question, add_special_tokens=False).ids  # type: ignore[attr-defined]
    return SampleRequest(
        prompt_token_ids=ids,
        params=SamplingParams(max_tokens=10, stop_token_ids=(STOP,), seed=seed),
    )


def test_remote_fake_waits_and_reports_the_version_each_call_started_with(
    remote_fake: ModuleType, smollm2_tokenizer_dir: Path
) -> None:
    config = remote_fake.RemoteFakeConfig(
        model=str(smollm2_tokenizer_dir),
        forward_backward_s=0.2,
        optim_step_s=0.2,
        sample_s=0.4,
        sample_token_ms=0.0,
        accuracy_start=1.0,
        accuracy_max=1.0,
    )
    backend = remote_fake.RemoteFakeBackend(config)
    sampler = backend.sampler()
    tokenizer = backend._tokenizer

    async def sample_while_stepping() -> tuple[object, float]:
        started = time.monotonic()
        call = asyncio.ensure_future(sampler.sample(_request(backend, "What is 31 - 3?", 1)))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(backend.optim_step)
        result = await call
        return result, time.monotonic() - started

    result, elapsed = asyncio.run(sample_while_stepping())
    assert backend.weight_version == 1
    assert result.weight_version == 0, "a call in flight reports the version it started with"
    assert elapsed >= 0.4 * 0.9
    assert result.finish_reason == "stop" and result.completion_token_ids[-1] == STOP
    assert tokenizer.decode(result.completion_token_ids[:-1]) == "28"
    assert len(result.logprobs) == len(result.completion_token_ids)
    assert asyncio.run(sampler.sample(_request(backend, "hi", 1))).weight_version == 1

    datum = Datum(
        token_ids=[1, 2, 3],
        logprobs=[0.0, -1.0, -1.0],
        advantages=[1.0] * 3,
        action_mask=[False, True, True],
        observation_mask=[False] * 3,
    )
    started = time.monotonic()
    metrics = backend.forward_backward([datum], objective=None)
    assert time.monotonic() - started >= 0.2 * 0.9
    assert metrics["tokens"] == 3.0 and metrics["action_tokens"] == 2.0
    assert metrics["sequences"] == 1.0


def test_remote_fake_policy_is_right_more_often_at_later_versions(
    remote_fake: ModuleType, smollm2_tokenizer_dir: Path
) -> None:
    config = remote_fake.RemoteFakeConfig(
        model=str(smollm2_tokenizer_dir), accuracy_start=0.2, accuracy_gain=0.2
    )
    backend = remote_fake.RemoteFakeBackend(config)
    sampler = backend.sampler()

    def right(version: int) -> int:
        return sum(
            sampler.reply(_request(backend, "What is 66 + 25?", seed), version) == "91"
            for seed in range(200)
        )

    assert right(0) < right(3) <= 200
    assert sampler.reply(_request(backend, "What is 66 + 25?", 7), 2) == sampler.reply(
        _request(backend, "What is 66 + 25?", 7), 2
    ), "replies are deterministic"


def test_remote_fake_state_round_trips(
    remote_fake: ModuleType, smollm2_tokenizer_dir: Path, tmp_path: Path
) -> None:
    config = remote_fake.RemoteFakeConfig(model=str(smollm2_tokenizer_dir), optim_step_s=0.0)
    backend = remote_fake.RemoteFakeBackend(config)
    threads = [threading.Thread(target=backend.optim_step) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    backend.save_state(str(tmp_path / "cut"))
    restored = remote_fake.RemoteFakeBackend(config)
    restored.load_state(str(tmp_path / "cut"))
    assert restored.weight_version == backend.weight_version == 3


def test_scheduler_sim_prints_every_policy_and_loses_no_group() -> None:
    result = _run("scheduler_sim.py", "--hours", "6", "--json")
    policies = json.loads(result.stdout)["policies"]
    assert list(policies) == ["always-on", "s1-separate", "s1-convert"]
    for figures in policies.values():
        assert figures["lost_groups"] == 0
        assert figures["groups_trained"] + figures["groups_left"] == figures["groups_produced"]
    assert policies["s1-separate"]["trainer_hours"] < policies["always-on"]["trainer_hours"]
    assert policies["s1-convert"]["node_hours"] < policies["s1-separate"]["node_hours"]


def test_buffer_benchmark_measures_every_buffer_at_a_tiny_size(tmp_path: Path) -> None:
    result = _run(
        "buffer.py",
        "--quick",
        "--no-s3",
        "--json",
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    figures = json.loads(result.stdout)
    buffers = ["file, fsync", "file, no fsync", "object/file"]
    assert [(r["buffer"], r["samples_per_append"]) for r in figures["appends"]] == [
        (b, n) for b in buffers for n in (1, 64)
    ]
    assert all(r["appends_per_s"] > 0 and r["append_p99_ms"] > 0 for r in figures["appends"])
    assert [r["buffer"] for r in figures["select"]] == buffers
    assert all(r["select_p50_ms"] > 0 for r in figures["select"])
    recovery = {(r["buffer"], r["samples_per_append"]): r for r in figures["recovery"]}
    assert set(recovery) == {("file", 64), ("file", 1), ("object/file", 64)}
    assert recovery[("file", 1)]["appends"] > recovery[("file", 64)]["appends"] > 0
    assert recovery[("file", 1)]["cold_s"] > 0
    assert recovery[("object/file", 64)]["nothing_committed_s"] > 0


def test_shell_sft_rl_transcripts_solve_every_train_task(tmp_path: Path) -> None:
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap()
    result = _run(
        "shell_sft_rl.py", "--transcripts-only", "--json", "--output-dir", tmp_path, timeout=120
    )
    figures = json.loads(result.stdout)
    train, held_out = figures["train_tasks"], figures["held_out_tasks"]
    shipped = sorted(p.name for p in (ROOT / "examples/tasks/shell").iterdir() if p.is_dir())
    assert (len(train), len(held_out)) == (len(shipped) - 6, 6)
    assert sorted(train + held_out) == shipped
    assert sorted(p.name for p in (tmp_path / "tasks" / "held-out").iterdir()) == held_out
    transcripts = figures["transcripts"]
    assert [t["task_id"] for t in transcripts] == train
    assert all(t["reward"] == 1.0 and t["turns"] == t["commands"] + 1 for t in transcripts)
    lines = (tmp_path / "sft.jsonl").read_text().splitlines()
    assert len(lines) == len(train)
    for line in lines:
        messages = json.loads(line)["messages"]
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert messages[-1] == {"role": "assistant", "content": "DONE"}
        for reply, observation in zip(messages[2:-1:2], messages[3:-1:2], strict=True):
            assert reply["role"] == "assistant" and reply["content"].startswith("```bash\n")
            assert observation["role"] == "user"
            assert observation["content"].startswith("Exit code: 0\nOutput:\n")


def test_sft_benchmark_answers_help() -> None:
    _answers_help(
        "sft.py", "--json", "--output-dir", "--no-baseline", "--epochs", "--learning-rate"
    )


def test_sft_benchmark_transcripts_answer_every_train_task_as_the_reward_wants(
    tmp_path: Path,
) -> None:
    sft = _load("sft")
    path = tmp_path / "transcripts.jsonl"
    assert sft.write_transcripts(path) == 240
    assert path.read_text() == (ROOT / "examples/sft-then-rl/arithmetic-sft.jsonl").read_text()
    tasks = [json.loads(line) for line in (ROOT / "examples/tasks/arithmetic.jsonl").open()]
    held_out = {
        json.loads(line)["question"]
        for line in (ROOT / "examples/tasks/arithmetic-eval.jsonl").open()
    }
    for task, line in zip(tasks, path.read_text().splitlines(), strict=True):
        system, user, reply = json.loads(line)["messages"]
        assert system == {"role": "system", "content": "Answer with the number only."}
        assert user == {"role": "user", "content": task["question"]}
        assert reply == {"role": "assistant", "content": task["answer"]}
        assert task["question"] not in held_out
    assert sft.write_transcripts(path, 10) == 10
    assert len(path.read_text().splitlines()) == 10


def test_vllm_cpu_benchmark_answers_help_and_dry_run_starts_nothing(tmp_path: Path) -> None:
    _answers_help("vllm_cpu.py", "--json", "--steps", "--modes", "--dry-run", "--output-dir")
    result = _run("vllm_cpu.py", "--dry-run", "--steps", "3", "--output-dir", tmp_path)
    commands = [line for line in result.stdout.splitlines() if "rllm-core run" in line]
    assert len(commands) == 4  # lora and full, each with the torch and the vLLM sampler
    assert all("run.steps=3" in line for line in commands)
    assert sum("sampler.name=" in line for line in commands) == 2
    assert sum("trainer.lora=" in line for line in commands) == 2
    assert list(tmp_path.iterdir()) == []


def test_filter_groups_benchmark_answers_help_and_dry_run_starts_nothing(tmp_path: Path) -> None:
    _answers_help(
        "filter_groups.py", "--json", "--steps", "--max-sample-batches", "--dry-run", "--output-dir"
    )
    result = _run("filter_groups.py", "--dry-run", "--steps", "3", "--output-dir", tmp_path)
    commands = result.stdout.splitlines()
    assert len(commands) == 2
    assert all("run.steps=3" in line and "rllm-core run" in line for line in commands)
    assert 'algorithm.filter_groups="none"' in commands[0]
    assert 'algorithm.filter_groups="zero-variance"' in commands[1]
    assert "algorithm.max_sample_batches=3" in commands[1]
    assert list(tmp_path.iterdir()) == []


def test_agent_quickstart_benchmark_answers_help_and_dry_run_starts_nothing(tmp_path: Path) -> None:
    _answers_help(
        "agent_quickstart.py",
        *("--json", "--seeds", "--modes", "--attempts", "--dry-run", "--output-dir"),
    )
    result = _run(
        "agent_quickstart.py", "--dry-run", "--seeds", "0", "1", "--modes", "none",
        "zero-variance", "--output-dir", tmp_path,
    )  # fmt: skip
    commands = result.stdout.splitlines()
    # Every seed runs the first mode; the other modes run for the first seed only.
    assert [line.split()[1] for line in commands] == ["eval", "sft", "eval", *["run"] * 3]
    assert 'trainer.model="smollm2-135m-instruct"' in commands[0]
    assert all("--attempts 4" in line for line in commands if " eval " in line)
    runs = [line for line in commands if " run " in line]
    assert ["run.seed=1" in line for line in runs] == [False, True, False]
    assert ['filter_groups="none"' in line for line in runs] == [True, True, False]
    assert list(tmp_path.iterdir()) == []


def test_mini_swe_agent_benchmark_answers_help_and_dry_run_starts_nothing(tmp_path: Path) -> None:
    _answers_help("mini_swe_agent.py", "--json", "--steps", "--before", "--dry-run", "--output-dir")
    result = _run(
        "mini_swe_agent.py", "--dry-run", "--before", "--steps", "3", "--output-dir", tmp_path
    )
    before, shipped = result.stdout.splitlines()
    assert "run.steps=1" in before and "run.steps=3" in shipped
    assert all("rllm-core run" in line for line in (before, shipped))
    plan = tomllib.loads((tmp_path / "before.toml").read_text())
    assert f"run {tmp_path / 'before.toml'} " in before
    assert plan["trainer"]["prefix_cache_mb"] == 0 and plan["trainer"]["cpu_threads"] == 1
    assert "share_prefixes" not in plan["trainer"] and "micro_batch_tokens" not in plan["trainer"]
    assert plan["harness"]["step_limit"] == 6 and Path(plan["tasks"]["path"]).is_dir()
    assert shipped.startswith("shipped:") and "examples/mini-swe-agent/plan.toml" in shipped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["before.toml"]


def test_agent_train_memory_benchmark_answers_help() -> None:
    _answers_help(
        "agent_train_memory.py",
        *("--json", "--quick", "--episodes", "--prompt", "--turns", "--threads"),
    )


def test_prefix_reuse_benchmark_answers_help_and_dry_run_starts_nothing() -> None:
    _answers_help("prefix_reuse.py", "--json", "--model", "--limit", "--attempts", "--dry-run")
    result = _run("prefix_reuse.py", "--dry-run", "--limit", "3")
    without, default = result.stdout.splitlines()
    assert all("rllm-core eval" in line and "--limit 3" in line for line in (without, default))
    assert "trainer.prefix_cache_mb=0" in without and "prefix_cache_mb" not in default


def test_prefix_sharing_benchmark_answers_help_and_dry_run_trains_nothing() -> None:
    _answers_help("prefix_sharing.py", "--json", "--quick", "--groups", "--calls", "--dry-run")
    result = _run("prefix_sharing.py", "--dry-run")
    padded, shared, no_recompute, mmap = (
        json.loads(line.split(": ", 1)[1]) for line in result.stdout.splitlines()
    )
    assert "share_prefixes" not in padded and padded["gradient_checkpointing"]
    assert shared["share_prefixes"] and shared["gradient_checkpointing"]
    assert no_recompute["share_prefixes"] and "gradient_checkpointing" not in no_recompute
    assert mmap == {**shared, "malloc_mmap_threshold_kb": 1024}


def test_terminus_2_benchmark_answers_help_dry_run_and_times_a_few_commands() -> None:
    _answers_help("terminus_2.py", "--json", "--count", "--command", "--skip-episode", "--dry-run")
    result = _run("terminus_2.py", "--dry-run", "--limit", "2")
    assert "rllm-core eval" in result.stdout and "--limit 2" in result.stdout
    from rllm_core.sidevenvs import side_venv_python
    from rllm_harness_terminus_2.sideenv import HARBOR

    if side_venv_python(HARBOR) is None:
        reason = (
            "harbor's side environment is not built (python -m rllm_harness_terminus_2.sideenv)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    result = _run("terminus_2.py", "--skip-episode", "--count", "3", "--json", timeout=120)
    report = json.loads(result.stdout)
    for figures in report["bridge"].values():
        assert figures["direct"]["count"] == figures["bridge"]["count"] == 3
        assert figures["bridge"]["median_ms"] > 0
    assert "episode" not in report


def test_distill_benchmark_answers_help_and_dry_run_starts_nothing(tmp_path: Path) -> None:
    _answers_help("distill.py", "--json", "--steps", "--teacher", "--dry-run", "--out")
    result = _run("distill.py", "--dry-run", "--steps", "3", "--out", tmp_path)
    commands = result.stdout.splitlines()
    assert [line.split()[1] for line in commands] == ["run", "run", "eval"]
    grpo, distill, teacher_eval = commands
    assert all("run.steps=3" in line and "run.eval_every=1" in line for line in (grpo, distill))
    teacher = tmp_path / "teacher-model"
    assert "examples/distill/teacher.toml" in grpo and f'run.export="{teacher}"' in grpo
    assert "examples/distill/plan.toml" in distill
    assert f'algorithm.advantage.teacher.model="{teacher}"' in distill
    assert f'trainer.model="{teacher}"' in teacher_eval
    assert list(tmp_path.iterdir()) == []
    given = _run("distill.py", "--dry-run", "--teacher", tmp_path / "t", "--out", tmp_path)
    assert "run.export" not in given.stdout.splitlines()[0]


def test_gateway_workers_benchmark_answers_help_and_dry_run_starts_nothing() -> None:
    _answers_help("gateway_workers.py", "--json", "--workers", "--modes", "--route", "--dry-run")
    result = _run("gateway_workers.py", "--dry-run", "--workers", "1,2", "--modes", "plain")
    one, two = result.stdout.splitlines()
    assert all(line.startswith("rllm-core gateway serve") for line in (one, two))
    assert one.endswith("--workers 1") and two.endswith("--workers 2")
    assert all("--token-mode plain" in line for line in (one, two))
