"""``rllm-core runs show|list`` and the parts of ``traces show`` that need no trace store,
on run folders written with the run's own record writers (``RunFolder``, ``step_metrics``,
``episode_record``), run as real subprocesses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from reference.cli_process import run_cli as cli
from rllm_core.inspection import InspectionError
from rllm_core.inspection.conversation import trace_store_path
from rllm_core.inspection.episodes import find_episode, read_episodes, run_prefix
from rllm_core.inspection.runs import list_runs, run_report
from rllm_core.run.folder import RunFolder, write_json
from rllm_core.run.metrics import episode_record, step_metrics, summarize
from rllm_core.types import Episode, Step, Trajectory

STEPS_PLANNED = 6


def resolved_plan(run_dir: Path) -> dict:
    """The shape ``ResolvedPlan.to_dict`` writes, for the quickstart components."""

    def component(where: str, kind: str, name: str, provider: str, **config) -> dict:
        return {"where": where, "kind": kind, "name": name, "provider": provider, "config": config}

    return {
        "path": "examples/quickstart/plan.toml",
        "plan": {"run": {"name": "quickstart", "steps": STEPS_PLANNED, "output_dir": "runs"}},
        "components": [
            component("[algorithm].loss", "loss", "dppo-tv", "rllm-loss-dppo 0.1.0", delta=0.15),
            component(
                "[algorithm].advantage",
                "advantage_estimator",
                "grpo",
                "rllm-advantage-estimator-grpo",
            ),
            component("[algorithm].aux_losses[0]", "loss", "echo", "rllm-loss-echo 0.1.0")
            | {"coef": 0.1},
            component(
                "[trainer]",
                "trainer_backend",
                "torch",
                "rllm-trainer-backend-torch",
                model="smollm2",
            ),
            component("[renderer]", "renderer", "chatml", "rllm-renderer-chatml"),
            component("[harness]", "harness", "single-turn", "rllm-harness-single-turn"),
            component("[tasks]", "task_source", "jsonl", "rllm-task-source-jsonl", path="t.jsonl"),
            component(
                "[trace_store]",
                "trace_store",
                "deltachain",
                "rllm-trace-store-deltachain",
                path=str(run_dir / "traces"),
            ),
        ],
    }


def episode(run_id: str, step: int, task: str, index: int, reward: float) -> Episode:
    session = f"{run_id}-s{step}-{task}-{index}-a0"
    steps = tuple(
        Step(
            trace_id=f"{session}-t{turn}",
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            logprobs=[-0.5, -0.25],
        )
        for turn in range(2)
    )
    return Episode(
        episode_id=session,
        task_id=task,
        group_id=f"{step}-{task}",
        session_id=session,
        trajectories=(Trajectory(lineage_id="main", steps=steps),),
        reward=reward,
    )


def write_run(
    root: Path, rewards: list[list[float]], *, status: str | None, name: str = "quickstart"
) -> RunFolder:
    """A run folder after ``len(rewards)`` steps (step k scored episodes with rewards[k-1]);
    ``summary.json`` as the loop writes it when ``status`` is given."""
    folder = RunFolder.create(root, name)
    folder.write_plan("# plan\n", resolved_plan(folder.path))
    for step, step_rewards in enumerate(rewards, start=1):
        episodes = [
            episode(folder.path.name, step, f"task-{i // 2}", i % 2, r)
            for i, r in enumerate(step_rewards)
        ]
        folder.append(folder.episodes, [episode_record(step, e) for e in episodes])
        folder.append(
            folder.metrics,
            step_metrics(
                step=step,
                episodes=episodes,
                infra_failures=0,
                retries=0,
                report={"datums": float(len(episodes))},
                datums=[],
                train={"loss": 0.1},
                rollout_s=2.0,
                train_s=1.0,
                step_s=3.5,
                weight_version=step,
            ),
        )
    for step in range(2, len(rewards) + 1, 2):
        (folder.checkpoints / f"step-{step}").mkdir(parents=True)
        (folder.checkpoints / f"step-{step}" / "loop.json").write_text("{}")
    (folder.checkpoints / f"step-{len(rewards) + 1}.partial").mkdir(parents=True)
    (folder.path / "reward.png").write_bytes(b"\x89PNG")
    if status is not None:
        rows = RunFolder.read_jsonl(folder.metrics)
        summary = summarize(rows) | {
            "status": status,
            "run_dir": str(folder.path),
            "wall_s": 42.0,
            "last_step": len(rewards),
            "weight_version": len(rewards),
        }
        write_json(folder.summary, summary)
    return folder


REWARDS = [[0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0], [0.5, 0.0, 0.0, 0.0]]


@pytest.fixture
def finished(tmp_path) -> RunFolder:
    return write_run(tmp_path / "runs", REWARDS, status="finished")


def test_report_reads_summary_metrics_checkpoints_components_and_plots(finished):
    report = run_report(finished.path)
    assert report["status"] == "finished" and report["has_summary"]
    assert (report["steps_done"], report["steps_planned"]) == (3, STEPS_PLANNED)
    assert (report["wall_s"], report["wall_source"]) == (42.0, "summary")
    assert report["reward"]["first"] == pytest.approx((0.25 + 0.75 + 0.125) / 3)
    assert (report["reward"]["best"], report["reward"]["best_step"]) == (0.75, 2)
    assert (report["accuracy"]["last"], report["accuracy"]["best_step"]) == (0.0, 2)
    assert report["episodes"] == 12
    assert report["tokens"]["sampled"] == 12 * 4
    assert report["checkpoints"] == [2]
    components = report["components"]
    assert components["trainer"]["model"] == "smollm2"
    assert components["loss"]["name"] == "dppo-tv"
    assert components["aux_losses"] == [
        {"name": "echo", "coef": 0.1, "provider": "rllm-loss-echo 0.1.0"}
    ]
    assert components["tasks"]["path"] == "t.jsonl"
    assert report["plots"] == {"reward": str(finished.path / "reward.png"), "loss": None}


def test_a_folder_without_summary_is_running_or_crashed_and_timed_from_metrics(tmp_path):
    folder = write_run(tmp_path, REWARDS[:2], status=None)
    report = run_report(folder.path)
    assert report["status"] == "running-or-crashed" and not report["has_summary"]
    assert report["steps_done"] == 2
    assert (report["wall_s"], report["wall_source"]) == (7.0, "metrics")
    assert report["reward"]["last"] == pytest.approx(0.5)


def test_a_folder_before_its_first_step_has_no_numbers(tmp_path):
    folder = write_run(tmp_path, [], status=None)
    report = run_report(folder.path)
    assert report["steps_done"] == 0
    assert report["reward"]["first"] is None and report["wall_s"] is None


def test_runs_show_json_is_the_report(finished):
    result = cli("runs", "show", str(finished.path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == run_report(finished.path)


def test_runs_show_prints_a_table_within_100_columns(finished, monkeypatch):
    monkeypatch.setenv("RLLM_CORE_OUTPUT", "rich")
    result = cli("runs", "show", str(finished.path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines), result.stdout
    text = result.stdout
    assert "finished" in text and "3 / 6" in text and "42.0s" in text
    assert "best 0.750 (step 2)" in text
    assert "step 2" in text and "dppo-tv + 0.1 x echo" in text and "model smollm2" in text
    assert str(finished.path / "reward.png") in "".join(text.split())


def test_runs_show_piped_is_one_label_and_value_per_line(finished):
    result = cli("runs", "show", str(finished.path))
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("\t") for line in result.stdout.splitlines())
    assert lines["status"] == "finished" and lines["steps"] == "3 / 6"
    assert lines["loss"] == "dppo-tv + 0.1 x echo"
    assert lines["plots"] == str(finished.path / "reward.png")


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_runs_show_rejects_what_is_not_a_run_folder(tmp_path, make):
    target = tmp_path / "nothing"
    if make == "empty":
        target.mkdir()
    result = cli("runs", "show", str(target))
    assert result.returncode == 2
    assert result.stdout == ""
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert str(target) in message and "rllm-core runs list" in message


def test_runs_list_is_newest_first_and_skips_other_folders(tmp_path):
    root = tmp_path / "runs"
    old = write_run(root, REWARDS, status="interrupted", name="old")
    new = write_run(root, REWARDS[:1], status=None, name="new")
    os.utime(old.resolved_plan, (1_000_000, 1_000_000))
    (root / "notes").mkdir()
    records = list_runs(root)
    assert [r["name"] for r in records] == [new.path.name, old.path.name]
    assert [r["status"] for r in records] == ["running-or-crashed", "interrupted"]
    result = cli("runs", "list", str(root))
    assert result.returncode == 0, result.stderr
    assert result.stdout.index(new.path.name) < result.stdout.index(old.path.name)
    assert "3/6" in result.stdout and "notes" not in result.stdout


def test_runs_list_defaults_to_runs_and_rejects_a_missing_directory(tmp_path, finished):
    result = cli("runs", "list", "--json", cwd=finished.path.parent.parent)
    assert [r["name"] for r in json.loads(result.stdout)] == [finished.path.name]
    result = cli("runs", "list", cwd=tmp_path / "runs" / finished.path.name)
    assert result.returncode == 2
    assert "'runs' is not a directory" in result.stderr and "output_dir" in result.stderr


def test_traces_list_shows_episodes_with_short_ids(finished, monkeypatch):
    result = cli("traces", "show", str(finished.path), "--list", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == 12
    assert rows[0] == {
        "episode_id": f"{finished.path.name}-s1-task-0-0-a0",
        "step": 1,
        "task_id": "task-0",
        "reward": 0.0,
        "termination": "done",
        "turns": 2,
        "completion_tokens": 4,
    }
    piped = cli("traces", "show", str(finished.path), "--list")
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert lines[1] == "Episode\tStep\tTask\tReward\tTurns\tEnd"
    assert "s2-task-1-1-a0\t2\ttask-1\t" in piped.stdout and len(lines) == 2 + 12
    monkeypatch.setenv("RLLM_CORE_OUTPUT", "rich")
    table = cli("traces", "show", str(finished.path), "--list")
    assert table.returncode == 0, table.stderr
    assert "s2-task-1-1-a0" in table.stdout
    assert all(len(line) <= 100 for line in table.stdout.splitlines())


def test_episode_ids_match_whole_by_prefix_and_without_the_run_prefix(finished):
    records = read_episodes(finished)
    full = f"{finished.path.name}-s2-task-0-1-a0"
    assert find_episode(records, full, folder=finished)["episode_id"] == full
    assert find_episode(records, full[:-3], folder=finished)["episode_id"] == full
    assert find_episode(records, "s2-task-0-1", folder=finished)["episode_id"] == full
    with pytest.raises(InspectionError, match=r"ambiguous.*s2-task-0-0-a0.*--list"):
        find_episode(records, "s2-task-0", folder=finished)
    with pytest.raises(InspectionError, match=r"no episode 's9'.*12 episodes.*--list"):
        find_episode(records, "s9", folder=finished)


def test_a_renamed_folder_keeps_its_run_prefix_and_trace_store(finished, tmp_path):
    moved = RunFolder(finished.path.rename(tmp_path / "copy"))
    records = read_episodes(moved)
    assert run_prefix(records, moved) == f"{finished.path.name}-"
    configured = str(Path("runs") / finished.path.name / "traces")
    (moved.path / "traces").mkdir()
    assert trace_store_path(moved, configured) == moved.path / "traces"
    assert trace_store_path(moved, "/elsewhere/store") == Path("/elsewhere/store")


def test_traces_show_errors_name_the_path_and_what_to_do(finished, tmp_path):
    path = str(finished.path)
    unknown = cli("traces", "show", path, "--episode", "nope")
    assert unknown.returncode == 2
    assert "no episode 'nope'" in unknown.stderr and f"traces show {path} --list" in unknown.stderr
    missing_store = cli("traces", "show", path, "--episode", "s1-task-0-0")
    assert missing_store.returncode == 2
    assert "trace store" in missing_store.stderr and "is missing" in missing_store.stderr
    assert str(finished.path / "traces") in missing_store.stderr
    for args in ([], ["--list", "--episode", "x"]):
        usage = cli("traces", "show", path, *args)
        assert usage.returncode == 2 and "either --episode ID or --list" in usage.stderr
    finished.episodes.unlink()
    no_episodes = cli("traces", "show", path, "--list")
    assert no_episodes.returncode == 2
    assert f"{path} has no episodes.jsonl" in no_episodes.stderr
    not_run = cli("traces", "show", str(tmp_path), "--list")
    assert not_run.returncode == 2 and "is not a run folder" in not_run.stderr
    for result in (unknown, missing_store, no_episodes, not_run):
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_last_figure_is_that_of_the_last_line_holding_it():
    rows = [{"step": 1, "accuracy": 0.25}, {"step": 2, "accuracy": 0.5}, {"step": 3}]
    assert summarize(rows)["accuracy_last"] == 0.5
    assert summarize([{"step": 1}])["accuracy_last"] is None
