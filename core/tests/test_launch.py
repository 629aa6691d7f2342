"""``rllm-core run`` in several processes: the launcher command, the torchrun environment, rank
0's exit code and signals through a stand-in for torchrun, and the ranks above 0 (followers) over
a fake ParallelTrainer plugin, each run as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rllm_core.run.launch import (
    LAUNCH_DIR_ENV,
    DistributedEnv,
    WorldSizeMismatch,
    check_world_size,
    distributed_env,
    launcher_argv,
)

# ------------------------------------------------------------------ command and environment


def test_launcher_argv_starts_the_same_run_through_torchrun():
    args = ["run", "plan.toml", "--set", "run.steps=3", "--plain"]
    assert launcher_argv(2, args, python="/py") == [
        "/py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "rllm_core",
        "run",
        "plan.toml",
        "--set",
        "run.steps=3",
        "--plain",
    ]
    assert launcher_argv(4, ["run", "p.toml"])[0] == sys.executable


def test_distributed_env_reads_the_variables_torchrun_sets():
    assert distributed_env({}) is None
    assert distributed_env({"PATH": "/bin"}) is None
    group = distributed_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert group == DistributedEnv(rank=3, world_size=4, local_rank=1)
    assert distributed_env({"RANK": "0", "WORLD_SIZE": "1"}) == DistributedEnv(0, 1, 0)


def test_distributed_env_names_a_bad_or_missing_variable():
    with pytest.raises(ValueError, match=r"WORLD_SIZE='two' is not an integer"):
        distributed_env({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match=r"sets RANK but not WORLD_SIZE"):
        distributed_env({"RANK": "0"})


def test_a_world_size_other_than_the_plans_is_an_error_naming_both():
    check_world_size(DistributedEnv(1, 2, 1), 2, "plan.toml")
    with pytest.raises(WorldSizeMismatch) as caught:
        check_world_size(DistributedEnv(0, 3, 0), 2, "plan.toml")
    message = str(caught.value)
    assert "WORLD_SIZE=3" in message
    assert "plan.toml has [trainer].parallel.world_size = 2" in message
    assert "--set trainer.parallel.world_size=3" in message


# ------------------------------------------------------------------ launch() over a fake torchrun

# Stands in for torchrun: starts "rank 0" in a session of its own (as torchrun does), exits 1
# when it fails, and records a signal it receives itself (torchrun would kill the ranks).
FAKE_TORCHRUN = """
import os, signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def hit(signum, frame):
    (out / "torchrun-signal").write_text(str(signum))
    sys.exit(1)
signal.signal(signal.SIGINT, hit)
signal.signal(signal.SIGTERM, hit)
if sys.argv[2] == "no-rank":
    time.sleep(60)
rank0 = subprocess.Popen(
    [sys.executable, sys.argv[3], sys.argv[2], *sys.argv[4:]], start_new_session=True
)
sys.exit(0 if rank0.wait() == 0 else 1)
"""

# Rank 0: reports its pid and exit code the way `rllm-core run` does under the launcher.
FAKE_RANK0 = """
import signal, sys, time
from rllm_core.run.launch import report_rank0
def stop(signum, frame):
    sys.exit({signal.SIGINT: 130, signal.SIGTERM: 143}[signum])
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
with report_rank0():
    if sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    print("rank 0 waiting", flush=True)
    time.sleep(60)
"""

DRIVER = """
import sys
from rllm_core.run.launch import launch
sys.exit(launch(2, ["run"], argv=[sys.executable, *sys.argv[1:]]))
"""


def _driver(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    (tmp_path / "torchrun.py").write_text(FAKE_TORCHRUN)
    (tmp_path / "rank0.py").write_text(FAKE_RANK0)
    command = [sys.executable, "-c", DRIVER, str(tmp_path / "torchrun.py"), str(tmp_path)]
    command += [args[0], str(tmp_path / "rank0.py"), *args[1:]]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)


def test_launch_exits_with_rank0s_code_not_torchruns(tmp_path):
    driver = _driver(tmp_path, "exit", "3")
    assert driver.wait(timeout=30) == 3
    driver = _driver(tmp_path, "exit", "0")
    assert driver.wait(timeout=30) == 0


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_at_the_terminal_reaches_rank0_only(tmp_path, signum, code):
    driver = _driver(tmp_path, "wait")
    assert driver.stdout is not None
    assert driver.stdout.readline() == "rank 0 waiting\n"
    # A terminal's Ctrl-C signals the whole foreground process group.
    os.killpg(driver.pid, signum)
    assert driver.wait(timeout=30) == code
    assert not (tmp_path / "torchrun-signal").exists()


def test_a_signal_before_rank0_started_stops_the_launcher(tmp_path):
    driver = _driver(tmp_path, "no-rank")
    time.sleep(1.0)
    os.killpg(driver.pid, signal.SIGTERM)
    assert driver.wait(timeout=30) == 143
    assert (tmp_path / "torchrun-signal").read_text() == str(int(signal.SIGTERM))


def test_report_rank0_writes_nothing_without_the_launcher(tmp_path):
    script = "from rllm_core.run.launch import report_rank0\nwith report_rank0(): pass"
    env = {k: v for k, v in os.environ.items() if k != LAUNCH_DIR_ENV}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, timeout=30)
    assert done.returncode == 0
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ ranks above 0

FAKE_TRAINERS = """
from pathlib import Path
from pydantic import BaseModel, ConfigDict
from rllm_core import ComponentSpec, hookimpl
from rllm_core.ports import ParallelSettings


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    marker: str
    parallel: ParallelSettings = ParallelSettings()
    follows: bool = True
    seed: int = 0


class SoloConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 0


class Follower:
    def __init__(self, config):
        self.config = config
        self.rank = 1
        self.world_size = config.parallel.world_size

    def _note(self, what):
        with open(self.config.marker, "a") as out:
            out.write(what + "\\n")

    def follow(self):
        self._note(f"followed world_size={self.world_size}")

    def close(self):
        self._note("closed")


class NoFollower:
    def __init__(self, config):
        self.config = config

    def close(self):
        with open(self.config.marker, "a") as out:
            out.write("closed\\n")


def build(config):
    return Follower(config) if config.follows else NoFollower(config)


@hookimpl
def rllm_trainer_backends():
    yield ComponentSpec(
        kind="trainer_backend", name="fake-parallel", factory=build, config=Config,
        summary="a trainer that follows rank 0",
    )
    yield ComponentSpec(
        kind="trainer_backend", name="fake-solo", factory=lambda c: None, config=SoloConfig,
        summary="a trainer of one process",
    )


class RendererConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


@hookimpl
def rllm_renderers():
    yield ComponentSpec(
        kind="renderer", name="fake-renderer", factory=lambda c: None, config=RendererConfig,
        summary="never built by a follower",
    )
"""

PLAN = """
[run]
name = "ranks"
steps = 1

[algorithm]
loss = "dppo-tv"
advantage = "grpo"
group_size = 2
batch_size = 1

[trainer]
name = "fake-parallel"
marker = "{marker}"
parallel = {{ world_size = 2 }}

[renderer]
name = "fake-renderer"

[harness]
name = "single-turn"

[tasks]
name = "jsonl"
path = "tasks.jsonl"

[trace_store]
name = "deltachain"
"""


@pytest.fixture
def ranks(fake_distributions, tmp_path):
    fake_distributions.add(
        "rllm-trainer-backend-fake-parallel",
        version="0.1.0",
        entry_points={"fake_parallel": "fake_parallel"},
        modules={"fake_parallel": FAKE_TRAINERS},
    )
    (tmp_path / "tasks.jsonl").write_text(
        json.dumps({"id": "t1", "question": "What is 1 + 1?", "answer": "2"}) + "\n"
    )
    (tmp_path / "plan.toml").write_text(PLAN.format(marker=tmp_path / "marker"))
    return fake_distributions


def _rank(fakes, cwd: Path, rank: int, world: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=fakes.pythonpath, COLUMNS="200")
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    env.pop(LAUNCH_DIR_ENV, None)
    return subprocess.run(
        [sys.executable, "-m", "rllm_core", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_follower_builds_the_trainer_follows_and_writes_no_run_folder(ranks, tmp_path):
    done = _rank(ranks, tmp_path, 1, 2, "run", "plan.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "marker").read_text() == "followed world_size=2\nclosed\n"
    assert "run folder" not in done.stdout
    assert not (tmp_path / "runs").exists()


def test_a_follower_of_a_backend_without_follow_fails_naming_it(ranks, tmp_path):
    done = _rank(ranks, tmp_path, 1, 2, "run", "plan.toml", "--set", "trainer.follows=false")
    assert done.returncode == 2
    assert "trainer_backend:fake-parallel does not train in several processes" in done.stderr
    assert (tmp_path / "marker").read_text() == "closed\n"


def test_torchruns_world_size_must_be_the_plans(ranks, tmp_path):
    for rank in (0, 1):
        done = _rank(ranks, tmp_path, rank, 3, "run", "plan.toml")
        assert done.returncode == 2, done.stderr
        assert "torchrun started WORLD_SIZE=3" in done.stderr
        assert "[trainer].parallel.world_size = 2" in done.stderr
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "marker").exists()


def test_a_sampler_role_refuses_to_be_a_rank(ranks, tmp_path):
    done = _rank(ranks, tmp_path, 0, 2, "run", "plan.toml", "--role", "sampler")
    assert done.returncode == 2
    assert "--role sampler runs in one process" in done.stderr


def test_plan_check_refuses_parallel_for_a_backend_of_one_process(ranks, tmp_path):
    plan = (tmp_path / "plan.toml").read_text()
    marker = f'marker = "{tmp_path / "marker"}"\n'
    (tmp_path / "solo.toml").write_text(
        plan.replace("fake-parallel", "fake-solo").replace(marker, "")
    )
    env = dict(os.environ, PYTHONPATH=ranks.pythonpath, COLUMNS="400")
    env.pop("RANK", None)
    done = subprocess.run(
        [sys.executable, "-m", "rllm_core", "plan", "check", "solo.toml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    message = done.stderr
    assert "[trainer].parallel: trainer backend 'fake-solo' trains in one process" in message
    assert "no ParallelTrainer" in message


def test_a_resume_may_change_the_world_size_and_nothing_else_of_parallel():
    from rllm_core.run.start import comparable_plan as _comparable

    def data(parallel):
        trainer = {"name": "torch", "model": "m"} | ({"parallel": parallel} if parallel else {})
        return {"plan": {"run": {"steps": 3}, "trainer": trainer}}

    two = _comparable(data({"world_size": 2}), "run-1")
    assert two == _comparable(data({"world_size": 1}), "run-1")
    assert two == _comparable(data(None), "run-1")
    fsdp = _comparable(data({"world_size": 2, "strategy": "fsdp"}), "run-1")
    assert fsdp != _comparable(data({"world_size": 2, "strategy": "ddp"}), "run-1")


def test_a_process_that_only_samples_builds_its_trainer_for_one_process(ranks, tmp_path):
    code = (
        "from pathlib import Path\n"
        "from rllm_core.run.components import prepare_plan\n"
        "from rllm_core.run.launch import in_one_process\n"
        "resolved = prepare_plan('plan.toml', (), run_dir=Path('run'))\n"
        "alone = in_one_process(resolved)\n"
        "print(resolved.get('[trainer]').config.parallel.world_size,"
        " alone.get('[trainer]').config.parallel.world_size,"
        " alone.get('[trainer]').config.marker == resolved.get('[trainer]').config.marker)\n"
    )
    env = dict(os.environ, PYTHONPATH=ranks.pythonpath)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "1", "True"]
