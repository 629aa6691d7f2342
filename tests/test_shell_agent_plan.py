"""examples/shell-agent/plan.toml: it validates, and 2 CI-sized steps of it train SmolLM2 on
multi-turn shell episodes in real bubblewrap sandboxes.

The run uses the plan as shipped except for its size (2 tasks x 2 rollouts, 3 turns of 32
tokens). What it checks is the cumulative token path end to end: an episode whose chain held
(no reset) is trained as exactly one datum, that datum is the last turn's prompt plus its
completion as the trace store rebuilds them, and every turn's sampled tokens are a separate
action span in it with the sampler's logprobs; and `rllm-core view` shows the run's longest
episode call by call in headless Chromium.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from reference.cli_process import overrides, plan_check, run_cli, run_folder
from reference.view_browser import serving, visit
from rllm_core.plugins import PluginManager
from rllm_core.types import Termination

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "shell-agent" / "plan.toml"
SHELL_TASKS = ROOT / "examples" / "tasks" / "shell"
MAX_TURNS = 3
MAX_TOKENS = 32


def require_bubblewrap() -> None:
    """The plan's sandbox demands bubblewrap: skip without it, fail in CI (which installs it)."""
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap("run this plan")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def spans(mask: list[bool]) -> list[tuple[int, int]]:
    """The [start, end) runs of True in ``mask``."""
    found: list[tuple[int, int]] = []
    start = None
    for i, value in enumerate([*mask, False]):
        if value and start is None:
            start = i
        elif not value and start is not None:
            found.append((start, i))
            start = None
    return found


def test_plan_check_accepts_the_shell_agent_plan():
    resolved = plan_check(PLAN, cwd=ROOT)
    components = {c["where"]: c for c in resolved["components"]}
    assert components["[harness]"]["name"] == "shell"
    assert components["[tasks]"]["name"] == "harbor"
    assert (ROOT / components["[tasks]"]["config"]["path"] / "dataset.toml").is_file()
    assert components["[sandbox]"]["name"] == "local"
    assert components["[sandbox]"]["config"]["isolation"] == "bwrap"
    assert components["[algorithm].aux_losses[0]"]["name"] == "echo"
    assert resolved["plan"]["gateway"]["token_mode"] == "cumulative"


def test_a_step_trains_one_datum_per_multi_turn_episode(smollm2_model_dir, tmp_path):
    require_bubblewrap()
    result = run_cli(
        "run",
        str(PLAN),
        "--plain",
        "--record-datums",
        *overrides(
            "run.steps=1",
            "run.save_every=0",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
            f"sampling.max_tokens={MAX_TOKENS}",
            f"harness.max_turns={MAX_TURNS}",
            "harness.max_output_chars=400",
            f'tasks.path="{SHELL_TASKS}"',
            "tasks.limit=2",
        ),
        cwd=tmp_path,
        timeout=600,
        columns=200,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "shell-agent")

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1]
    for line in metrics:
        assert line["episodes"] == 4.0 and line["infra_failures"] == 0.0
        assert line["trained"] == 1.0
        assert "train/echo/nll" in line and "train/echo/observation_tokens" in line
    assert max(m["train/echo/observation_tokens"] for m in metrics) > 0
    assert max(m["steps_per_datum"] for m in metrics) > 1

    episodes = read_jsonl(run_dir / "episodes.jsonl")
    assert len(episodes) == 4
    for episode in episodes:
        termination = Termination(episode["termination"])
        assert not termination.is_infrastructure, episode
        turns = sum(len(t["trace_ids"]) for t in episode["trajectories"])
        assert 1 <= turns <= MAX_TURNS
        if termination is Termination.MAX_TURNS:
            assert turns == MAX_TURNS

    datums = read_jsonl(run_dir / "datums.jsonl")
    assert len(datums) == sum(int(m["datums"]) for m in metrics)
    per_episode = Counter(d["episode_id"] for d in datums)
    resolved = json.loads((run_dir / "plan.resolved.json").read_text())
    (store_entry,) = [c for c in resolved["components"] if c["where"] == "[trace_store]"]
    config = dict(store_entry["config"], path=str(tmp_path / store_entry["config"]["path"]))
    store = PluginManager().get("trace_store", store_entry["name"]).build(config)
    try:
        merged = 0
        for episode in episodes:
            if len(episode["trajectories"]) != 1:
                continue
            assert per_episode[episode["episode_id"]] == 1, episode
            (datum,) = [d for d in datums if d["episode_id"] == episode["episode_id"]]
            traces = store.session(episode["session_id"])
            assert [t.record.trace_id for t in traces] == episode["trajectories"][0]["trace_ids"]
            assert all(t.chain_complete for t in traces)

            last = traces[-1]
            assert datum["token_ids"] == last.prompt_token_ids + last.record.completion_token_ids
            expected_spans = []
            for trace in traces:
                start = len(trace.prompt_token_ids)
                end = start + len(trace.record.completion_token_ids)
                assert datum["token_ids"][:end] == (
                    trace.prompt_token_ids + trace.record.completion_token_ids
                )
                assert datum["logprobs"][start:end] == pytest.approx(trace.record.logprobs, abs=0)
                expected_spans.append((start, end))
            assert spans(datum["action_mask"]) == expected_spans
            if len(traces) > 1:
                merged += 1
        assert merged > 0, "no episode with more than one turn was trained as one datum"
    finally:
        store.close()

    # rllm-core view shows this real run: an episode of several turns, each model call of it.
    longest = max(episodes, key=lambda e: sum(len(t["trace_ids"]) for t in e["trajectories"]))
    calls = sum(len(t["trace_ids"]) for t in longest["trajectories"])
    with serving(tmp_path / "runs") as url:
        name = run_dir.name
        data = httpx.get(
            f"{url}/api/episode", params={"run": name, "id": longest["episode_id"]}, timeout=10
        ).json()
        assert len(data["turns"]) == calls > 1
        html = visit(f"{url}/#/episode/{name}/{longest['episode_id']}", tmp_path, "ep.png", 1400)
    assert all(f"main · turn {turn}" in html for turn in range(calls))
