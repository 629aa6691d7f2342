"""The JSON API behind `rllm-core view`, called in-process over ASGI: run folders written in a
run's format from the shell-agent and quickstart plans (their deltachain trace stores hold ids
of the plans' real SmolLM2 tokenizer), read through the same readers as `runs show` and
`traces show`."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from rllm_core.cli import main
from rllm_core.run.folder import RunFolder
from rllm_core.testing.run_folders import write_agent_run
from rllm_core.view import RunsView, ViewApp

ROOT = Path(__file__).resolve().parents[1]
SHELL = ROOT / "examples" / "shell-agent" / "plan.toml"
QUICKSTART = ROOT / "examples" / "quickstart" / "plan.toml"


@pytest.fixture(scope="module")
def runs(smollm2_model_dir, tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("view") / "runs"
    shell = write_agent_run(base, SHELL, name="shell-agent", turns=5, when=1_700_000_000)
    quick = write_agent_run(
        base, QUICKSTART, name="quickstart", turns=1, reset=False, finished=False, when=1.7e9 + 60
    )
    return {"base": base, "shell": shell, "quick": quick}


def get(app: ViewApp, path: str, *, host: str = "127.0.0.1:8000", **kwargs: Any) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as client:
            return await client.get(path, **kwargs)

    return asyncio.run(call())


def ok(app: ViewApp, path: str, **params: Any) -> Any:
    response = get(app, path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def app(runs) -> ViewApp:
    return ViewApp(RunsView(runs["base"]))


def test_the_runs_list_has_what_runs_list_shows_and_more(app, runs):
    data = ok(app, "/api/runs")
    by_name = {r["name"]: r for r in data["runs"]}
    shell = by_name[runs["shell"].folder.path.name]
    quick = by_name[runs["quick"].folder.path.name]
    assert (shell["status"], quick["status"]) == ("finished", "running-or-crashed")
    assert shell["steps_done"] == 3 and shell["steps_planned"] == 10
    assert shell["wall_s"] == 12.0 and shell["checkpoints"] == [3]
    assert set(shell["reward"]) >= {"first", "last", "best", "best_step"}
    assert shell["components"]["harness"]["name"] == "shell"
    assert quick["components"]["harness"]["name"] == "single-turn"
    listed = CliRunner().invoke(main, ["runs", "list", str(runs["base"]), "--json"])
    for record in json.loads(listed.stdout):
        row = by_name[record["name"]]
        assert record["reward_last"] == row["reward"]["last"]
        assert record["steps_done"] == row["steps_done"]


def test_a_run_has_its_plan_eval_results_and_metric_columns(app, runs):
    name = runs["shell"].folder.path.name
    run = ok(app, "/api/run", run=name)
    assert run["plan"]["plan"]["run"]["name"] == "shell-agent"
    assert set(run["eval"]) == {"eval/pass@1", "eval/mean_reward"}
    assert run["eval"]["eval/pass@1"]["step"] == 3
    metrics = ok(app, "/api/metrics", run=name)
    assert metrics["steps"] == [1, 2, 3]
    for key in (
        "reward/mean",
        "train/loss",
        "train/grad_norm",
        "offpolicy/k3",
        "async/queue_groups",
    ):
        assert key in metrics["keys"] and len(metrics["series"][key]) == 3
    assert metrics["keys"][0] == "reward/mean"
    assert metrics["series"]["eval/pass@1"][:2] == [None, None]


def test_episodes_filter_and_page(app, runs):
    name = runs["shell"].folder.path.name
    everything = ok(app, "/api/episodes", run=name)
    assert everything["total"] == everything["matched"] == 12
    assert everything["facets"]["steps"] == [1, 2, 3] and everything["facets"]["groups"] == 6
    assert everything["prefix"] == f"{name}-"
    assert ok(app, "/api/episodes", run=name, step=2)["matched"] == 4
    assert {r["task_id"] for r in ok(app, "/api/episodes", run=name, task="find")["rows"]} == {
        "find-todo"
    }
    group = ok(app, "/api/episodes", run=name, group="1-count-files")
    assert [r["episode_id"] for r in group["rows"]] == [
        f"{name}-s1-count-files-0-a0",
        f"{name}-s1-count-files-1-a0",
    ]
    rewarded = ok(app, "/api/episodes", run=name, min_reward=1)
    assert rewarded["matched"] == sum(r["reward"] == 1.0 for r in everything["rows"])
    assert ok(app, "/api/episodes", run=name, termination="timeout")["matched"] == 0
    page = ok(app, "/api/episodes", run=name, offset=10, limit=5)
    assert [r["episode_id"] for r in page["rows"]] == [
        r["episode_id"] for r in everything["rows"][10:]
    ]


def test_an_episode_is_what_traces_show_prints_with_the_reset_marked(app, runs):
    shell = runs["shell"]
    name = shell.folder.path.name
    data = ok(app, "/api/episode", run=name, id=shell.reset_episode)
    shown = CliRunner().invoke(
        main, ["traces", "show", str(shell.folder.path), "--episode", shell.reset_episode, "--json"]
    )
    assert shown.exit_code == 0, shown.output
    expected = json.loads(shown.stdout)
    assert data["episode"] == expected["episode"]
    assert [{k: v for k, v in t.items() if k != "marker"} for t in data["turns"]] == expected[
        "turns"
    ]
    markers = [t["marker"] for t in data["turns"]]
    assert markers[:3] == [None] * 3 and markers[4] is None
    assert markers[3].startswith("── reset at turn 3: history_summarized (")
    first = data["turns"][0]["messages"][-1]
    assert first["tool_calls"][0]["name"] == "bash" and first["reasoning"]
    assert data["turns"][1]["messages"][0] == {
        "role": "tool",
        "content": "total 1\n-rw-r--r-- notes0.txt",
        "tool_call_id": "call-0",
    }
    # ids without the run's prefix reach the same episode
    short = shell.reset_episode.removeprefix(f"{name}-")
    assert ok(app, "/api/episode", run=name, id=short)["episode"] == data["episode"]


def test_the_tokens_of_a_call_are_its_observation_then_its_sampled_action(app, runs):
    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    shell = runs["shell"]
    data = ok(app, "/api/tokens", run=shell.folder.path.name, id=shell.reset_episode, call=3)
    with DeltaChainTraceStore(shell.folder.traces, read_only=True) as store:
        record = {t.record.trace_id: t.record for t in store.session(shell.reset_episode)}[
            data["trace_id"]
        ]
    tokens = data["tokens"]
    assert [t["id"] for t in tokens] == record.prompt_delta_token_ids + record.completion_token_ids
    assert [t["action"] for t in tokens] == [False] * len(record.prompt_delta_token_ids) + [
        True
    ] * len(record.completion_token_ids)
    assert [t["logprob"] for t in tokens if t["action"]] == pytest.approx(record.logprobs)
    assert data["reset_reason"] == "history_summarized" and data["prefix_tokens"] == 0
    assert data["history_break"]["dropped"] == 6
    assert tokens[0]["text"] == "<|im_start|>"
    later = ok(app, "/api/tokens", run=shell.folder.path.name, id=shell.reset_episode, call=4)
    assert later["reset_reason"] is None and later["prefix_tokens"] > 0


@pytest.mark.parametrize(
    ("path", "params", "status", "words"),
    [
        ("/api/run", {"run": "../etc"}, 404, "no run folder '../etc'"),
        ("/api/run", {}, 400, "names no run"),
        ("/api/episode", {"run": "R", "id": "nope"}, 404, "no episode 'nope'"),
        ("/api/tokens", {"run": "R", "id": "E", "call": 9}, 404, "call 9 is not one of them"),
        ("/api/tokens", {"run": "R", "id": "E", "call": "x"}, 400, "call='x'"),
        ("/api/episodes", {"run": "R", "step": "two"}, 400, "step='two' is not a whole number"),
        ("/api/nothing", {}, 404, "no page '/api/nothing'"),
        ("/static/..%2Fapp.py", {}, 404, "no file"),
    ],
)
def test_problems_are_json_errors_naming_the_value(app, runs, path, params, status, words):
    name = runs["shell"].folder.path.name
    params = {k: {"R": name, "E": runs["shell"].reset_episode}.get(v, v) for k, v in params.items()}
    response = get(app, path, params=params)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]


def test_the_page_and_its_files_are_served(app):
    page = get(app, "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/static/view.js">' in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for name, kind in (("view.js", "javascript"), ("view.css", "text/css")):
        response = get(app, f"/static/{name}")
        assert response.status_code == 200 and kind in response.headers["content-type"]
    assert "http" not in get(app, "/static/view.js").text.replace("http://www.w3.org/2000/svg", "")


def test_without_a_token_only_loopback_names_are_answered(app):
    assert get(app, "/api/runs", host="localhost:8000").status_code == 200
    assert get(app, "/api/runs", host="[::1]:8000").status_code == 200
    refused = get(app, "/api/runs", host="rebound.example:8000")
    assert refused.status_code == 403 and "--token" in refused.json()["error"]


def test_with_a_token_every_request_carries_it(runs):
    app = ViewApp(RunsView(runs["base"]), token="s3cret")
    assert get(app, "/api/runs", host="10.0.0.5:80").status_code == 401
    assert get(app, "/", host="10.0.0.5:80").status_code == 401
    wrong = {"authorization": "Bearer nope"}
    assert get(app, "/api/runs", host="10.0.0.5:80", headers=wrong).status_code == 401
    right = {"authorization": "Bearer s3cret"}
    assert get(app, "/api/runs", host="10.0.0.5:80", headers=right).status_code == 200
    opened = get(app, "/", host="10.0.0.5:80", params={"token": "s3cret"})
    assert opened.status_code == 303 and opened.headers["location"] == "/"
    cookie = opened.headers["set-cookie"].split(";")[0]
    assert "HttpOnly" in opened.headers["set-cookie"]
    assert get(app, "/api/runs", host="10.0.0.5:80", headers={"cookie": cookie}).status_code == 200
    # the token in a query string opens the page only, never the API
    sneaky = get(app, "/api/runs", host="10.0.0.5:80", params={"token": "s3cret"})
    assert sneaky.status_code == 401


def test_a_run_still_writing_is_followed(runs, tmp_path):
    quick = runs["quick"].folder
    app = ViewApp(RunsView(quick.path))
    assert ok(app, "/api/runs")["runs"][0]["name"] == quick.path.name
    before = ok(app, "/api/metrics", run=quick.path.name)["steps"]
    last = RunFolder.read_jsonl(quick.metrics)[-1]
    quick.append(quick.metrics, dict(last, step=before[-1] + 1))
    after = ok(app, "/api/metrics", run=quick.path.name)
    assert after["steps"] == [*before, before[-1] + 1]
    assert ok(app, "/api/runs")["runs"][0]["steps_done"] == before[-1] + 1


def test_a_run_of_ten_thousand_episodes_opens_in_under_two_seconds(runs, tmp_path):
    source = runs["quick"].folder
    folder = RunFolder.create(tmp_path, "big", when=1.7e9)
    folder.write_plan("# plan\n", source.read_resolved())
    template = RunFolder.read_jsonl(source.episodes)[0]
    lines = []
    for n in range(10_000):
        step, task = n // 100 + 1, f"task-{n % 50:03d}"
        record = dict(template, step=step, task_id=task, group_id=f"{step}-{task}")
        record["episode_id"] = f"{folder.path.name}-s{step}-{task}-{n // 50 % 2}-a0"
        lines.append(json.dumps(record))
    folder.episodes.write_text("\n".join(lines) + "\n", encoding="utf-8")
    row = RunFolder.read_jsonl(source.metrics)[0]
    folder.append(folder.metrics, [dict(row, step=s) for s in range(1, 101)])
    app = ViewApp(RunsView(tmp_path))
    start = time.perf_counter()
    ok(app, "/api/runs")
    ok(app, "/api/run", run=folder.path.name)
    ok(app, "/api/metrics", run=folder.path.name)
    first = ok(app, "/api/episodes", run=folder.path.name)
    elapsed = time.perf_counter() - start
    assert first["total"] == 10_000 and len(first["rows"]) == 100
    assert elapsed < 2.0, f"a 10k-episode run took {elapsed:.2f}s to open"
    start = time.perf_counter()
    later = ok(app, "/api/episodes", run=folder.path.name, offset=50, step=100)
    assert later["matched"] == 100 and len(later["rows"]) == 50
    assert time.perf_counter() - start < 0.5


def test_a_finished_quickstart_run_reads_as_runs_list_and_traces_show_read_it(
    quickstart_two_steps,
):
    cwd, done = quickstart_two_steps
    assert done.returncode == 0, done.stdout + done.stderr
    app = ViewApp(RunsView(cwd / "runs"))
    (run,) = ok(app, "/api/runs")["runs"]
    (listed,) = json.loads(
        CliRunner().invoke(main, ["runs", "list", str(cwd / "runs"), "--json"]).stdout
    )
    assert run["name"] == listed["name"] and run["status"] == "finished"
    assert run["steps_done"] == listed["steps_done"] == 2
    assert run["reward"]["last"] == listed["reward_last"]
    metrics = ok(app, "/api/metrics", run=run["name"])
    assert metrics["steps"] == [1, 2]
    lines = [json.loads(line) for line in (cwd / "runs" / run["name"] / "metrics.jsonl").open()]
    for key in ("reward/mean", "train/loss", "train/grad_norm"):
        assert metrics["series"][key] == [line[key] for line in lines]
    episodes = ok(app, "/api/episodes", run=run["name"])
    assert episodes["total"] == 8 and episodes["facets"]["steps"] == [1, 2]
    first = episodes["rows"][0]["episode_id"]
    data = ok(app, "/api/episode", run=run["name"], id=first)
    shown = CliRunner().invoke(
        main, ["traces", "show", str(cwd / "runs" / run["name"]), "--episode", first, "--json"]
    )
    assert shown.exit_code == 0, shown.output
    expected = json.loads(shown.stdout)
    assert data["episode"] == expected["episode"]
    assert [{k: v for k, v in t.items() if k != "marker"} for t in data["turns"]] == expected[
        "turns"
    ]


def test_a_character_split_across_tokens_goes_whole_to_the_token_that_completes_it(
    smollm2_tokenizer_dir,
):
    from rllm_core.plugins.manager import PluginManager
    from rllm_core.view.data import token_texts

    renderer = (
        PluginManager().get("renderer", "chatml").build({"tokenizer": str(smollm2_tokenizer_dir)})
    )
    ids = renderer.encode("héllo 你好!")
    alone = [renderer.decode([i]) for i in ids]
    assert "\ufffd" in "".join(alone), "the sample must split a character across tokens"
    texts = token_texts(renderer.decode, ids)
    assert "\ufffd" not in "".join(texts) and "".join(texts) == "héllo 你好!"
    assert len(texts) == len(ids) and texts[texts.index("你") - 1] == ""
