"""`rllm-core view` started as a command on port 0 over run folders written from the
shell-agent and quickstart plans: it serves the API, refuses another host without a token, and
its pages render in headless Chromium (the runs list, a run's curves with a second run
overlaid, an episode with a tool call, a reset marker and a call's tokens) without a console
error; the same on the finished two-step quickstart run the suite shares. Screenshots are
saved in the test's folder, and also in ``$RLLM_VIEW_SCREENSHOTS``
when set (``docs/images`` holds the ones docs/viewing.md shows)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from reference.view_browser import first_line, serving, visit
from rllm_core.testing.run_folders import write_agent_run

ROOT = Path(__file__).resolve().parents[1]
SHELL = ROOT / "examples" / "shell-agent" / "plan.toml"
QUICKSTART = ROOT / "examples" / "quickstart" / "plan.toml"
CLI = [sys.executable, "-m", "rllm_core"]


@pytest.fixture(scope="module")
def served(smollm2_model_dir, tmp_path_factory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("served") / "runs"
    shell = write_agent_run(base, SHELL, name="shell-agent", turns=5, when=1_700_000_000)
    quick = write_agent_run(
        base, QUICKSTART, name="quickstart", turns=1, reset=False, finished=False, when=1.7e9 + 60
    )
    process = subprocess.Popen(
        [*CLI, "view", str(base), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    )
    try:
        line = first_line(process)
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
        assert found, (
            f"no URL in {line!r}; stderr: {process.stderr.read() if process.poll() else ''}"
        )
        yield {"url": found[1], "shell": shell, "quick": quick, "base": base}
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert process.returncode == 0, process.stderr.read()


def test_the_command_serves_the_api_on_the_port_it_picked(served):
    runs = httpx.get(f"{served['url']}/api/runs", timeout=10).json()
    names = {r["name"] for r in runs["runs"]}
    assert names == {served["shell"].folder.path.name, served["quick"].folder.path.name}
    assert httpx.get(f"{served['url']}/", timeout=10).text.startswith("<!doctype html>")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10"])
def test_another_host_needs_a_token(tmp_path, host):
    done = subprocess.run(
        [*CLI, "view", str(tmp_path), "--host", host],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "RLLM_VIEW_TOKEN"},
    )
    assert done.returncode == 2
    assert f"--host {host!r} is not loopback" in done.stderr and "--token" in done.stderr


def test_a_path_that_is_no_run_folder_nor_directory_is_refused(tmp_path):
    done = subprocess.run(
        [*CLI, "view", str(tmp_path / "missing")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "is neither a run folder nor a directory" in done.stderr


# ---------------------------------------------------------------- in a browser


def test_the_runs_list_renders(served, tmp_path):
    html = visit(f"{served['url']}/", tmp_path, "view-runs.png", 520)
    assert 'data-page="runs"' in html
    for run in (served["shell"], served["quick"]):
        assert f">{run.folder.path.name}</a>" in html
    assert "running-or-crashed" in html and "finished" in html


def test_a_runs_curves_render_with_another_run_overlaid(served, tmp_path):
    shell, quick = served["shell"].folder.path.name, served["quick"].folder.path.name
    url = f"{served['url']}/#/run/{shell}?compare={quick}"
    html = visit(url, tmp_path, "view-run.png", 1500)
    for key in (
        "reward/mean",
        "train/loss",
        "train/grad_norm",
        "offpolicy/k3",
        "async/queue_groups",
    ):
        assert f'data-key="{key}"' in html
    chart = html[html.index('data-key="reward/mean"') :]
    chart = chart[: chart.index("</svg>")]
    assert chart.count("<path ") == 2, "one line per run"
    assert "eval/pass@1" in html and "step 3" in html


def test_an_episode_with_a_tool_call_and_a_reset_renders_with_its_tokens(served, tmp_path):
    shell = served["shell"]
    name = shell.folder.path.name
    url = f"{served['url']}/#/episode/{name}/{shell.reset_episode}?tokens=3"
    html = visit(url, tmp_path, "view-episode.png", 1700)
    assert html.count('class="toolcall"') == 4 and 'data-tool="bash"' in html
    assert html.count('class="reset"') == 2, "the marker before turn 3, and in its tokens"
    assert "reset at turn 3: history_summarized" in html
    assert "lineage reset here: history_summarized" in html
    assert 'class="tok act"' in html and 'class="tok obs"' in html
    assert "<details" in html and "reasoning (" in html


def test_a_finished_quickstart_run_renders_its_curves_and_an_episode(
    quickstart_two_steps, tmp_path
):
    cwd, done = quickstart_two_steps
    assert done.returncode == 0, done.stdout + done.stderr
    with serving(cwd / "runs") as url:
        (run,) = httpx.get(f"{url}/api/runs", timeout=10).json()["runs"]
        name = run["name"]
        html = visit(f"{url}/#/run/{name}", tmp_path, "quickstart-run.png", 1200)
        chart = html[html.index('data-key="reward/mean"') :]
        assert chart[: chart.index("</svg>")].count("<path ") == 1
        episodes = httpx.get(f"{url}/api/episodes?run={name}", timeout=10).json()
        episode = episodes["rows"][0]["episode_id"]
        html = visit(f"{url}/#/episode/{name}/{episode}", tmp_path, "quickstart-episode.png", 900)
        assert "What is" in html and "main · turn 0" in html
