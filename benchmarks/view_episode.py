"""`rllm-core view`: server time of an episode page with 50 turns.

Writes one run folder from ``examples/shell-agent/plan.toml`` in a run's format (its
deltachain trace store holds token ids of the plan's SmolLM2 tokenizer; see
:mod:`rllm_core.testing.run_folders`) with one episode of ``--turns`` model calls, each a
``bash`` tool call and its result, with a history summary at the third call. Then times, in
this process, what the server does for the episode page: the request the page makes
(``GET /api/episode``) through the view's ASGI app, answered by the same readers as
``rllm-core traces show``. "first load" is a fresh view (trace store opened, episodes read,
nothing cached), "again" the median and p95 of ``--repeat`` more loads; the page's HTML and
script, and the tokens of the last call (``GET /api/tokens``, on demand in the page), are
timed the same way. No network: the app is called over an in-process ASGI transport.

Goal: the episode's first load and its median load under 500 ms::

    .venv/bin/python benchmarks/view_episode.py             # a table
    .venv/bin/python benchmarks/view_episode.py --json      # one JSON object
    .venv/bin/python benchmarks/view_episode.py --dry-run   # what it would write and time

Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _tables import right_aligned

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "examples" / "shell-agent" / "plan.toml"
GOAL_MS = 500.0


def _requests(run: str, episode: str, turns: int) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "episode (GET /api/episode)": ("/api/episode", {"run": run, "id": episode}),
        "page HTML (GET /)": ("/", {}),
        "page script (GET /static/view.js)": ("/static/view.js", {}),
        f"tokens of call {turns - 1} (GET /api/tokens)": (
            "/api/tokens",
            {"run": run, "id": episode, "call": turns - 1},
        ),
    }


async def _time(app: Any, path: str, params: dict[str, Any], repeat: int) -> dict[str, Any]:
    import httpx

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        times = []
        size = 0
        for _ in range(repeat + 1):
            start = time.perf_counter()
            response = await client.get(path, params=params)
            times.append((time.perf_counter() - start) * 1000)
            if response.status_code != 200:
                raise SystemExit(f"{path} answered {response.status_code}: {response.text}")
            size = len(response.content)
    again = times[1:]
    return {
        "first_ms": times[0],
        "median_ms": statistics.median(again),
        "p95_ms": sorted(again)[max(0, round(0.95 * len(again)) - 1)],
        "bytes": size,
    }


def measure(out: Path, turns: int, repeat: int) -> dict[str, Any]:
    from rllm_core.testing.models import smollm2_model_dir
    from rllm_core.testing.run_folders import write_agent_run
    from rllm_core.view import RunsView, ViewApp

    smollm2_model_dir()
    written = write_agent_run(
        out / "runs", PLAN, name="view-bench", steps=1, groups=1, group_size=1, turns=turns
    )
    run = written.folder.path.name
    episode = written.tool_episode
    figures: dict[str, Any] = {}
    for label, (path, params) in _requests(run, episode, turns).items():
        app = ViewApp(RunsView(out / "runs"))  # a fresh view: nothing cached
        figures[label] = asyncio.run(_time(app, path, params, repeat))
    episode_figures = figures["episode (GET /api/episode)"]
    return {
        "plan": str(PLAN.relative_to(ROOT)),
        "turns": turns,
        "repeat": repeat,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "requests": figures,
        "goal_ms": GOAL_MS,
        "met": episode_figures["first_ms"] < GOAL_MS and episode_figures["median_ms"] < GOAL_MS,
    }


def table(figures: dict[str, Any]) -> str:
    rows = [
        [
            label,
            f"{f['first_ms']:.1f}",
            f"{f['median_ms']:.1f}",
            f"{f['p95_ms']:.1f}",
            f"{f['bytes'] / 1024:.1f}",
        ]
        for label, f in figures["requests"].items()
    ]
    headers = ["request", "first load ms", "again median ms", "again p95 ms", "KiB"]
    lines = [f"episode of {figures['turns']} turns, {figures['plan']}, {figures['repeat']} repeats"]
    lines += right_aligned(headers, rows, left=1)
    verdict = "met" if figures["met"] else "MISSED"
    lines.append(
        f"goal: the episode under {figures['goal_ms']:.0f} ms, first and median: {verdict}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--turns", type=int, default=50, help="model calls of the episode")
    parser.add_argument("--repeat", type=int, default=20, help="timed loads after the first")
    parser.add_argument("--output-dir", type=Path, default=None, help="where the run folder goes")
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would be written and timed, do nothing"
    )
    args = parser.parse_args(argv)
    if args.turns < 4 or args.repeat < 1:
        parser.error("--turns must be at least 4 (the summary is at the third call), --repeat 1")
    if args.dry_run:
        out = args.output_dir or Path(tempfile.gettempdir()) / "rllm-view-episode"
        print(f"would write a run folder of {PLAN.relative_to(ROOT)} under {out / 'runs'}")
        print(f"with one episode of {args.turns} turns, then time these requests:")
        for label in _requests("RUN", "EPISODE", args.turns):
            print(f"  {label}: first load and {args.repeat} more")
        return 0
    out = (
        args.output_dir.resolve()
        if args.output_dir
        else Path(tempfile.mkdtemp(prefix="rllm-view-"))
    )
    figures = measure(out, args.turns, args.repeat)
    print(json.dumps(figures) if args.json else table(figures))
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
