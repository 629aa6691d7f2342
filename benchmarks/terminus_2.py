"""The Terminus-2 harness: what its bridge costs per command, and one episode with a real model.

1. The bridge. Every command of the agent (a tmux ``send-keys`` or ``capture-pane``) leaves
   harbor's environment object in the driver process (Python 3.12), crosses the unix socket
   as a JSON line, runs through the sandbox port here and comes back. Timed back to back in
   one process, on the same sandbox: ``sandbox.exec`` of the command alone (the baseline),
   then the same command issued by the driver's environment object (the harness's
   ``time_bridge``). Both in the local backend without isolation (plain subprocesses) and,
   where bubblewrap works, isolated.
2. A real episode (skipped with ``--skip-episode``): ``rllm-core eval
   examples/terminus-2/plan.toml --split train --limit 1`` with SmolLM2-135M-Instruct
   through the gateway (the torch sampler), one shipped shell task in a bubblewrap sandbox:
   the termination it recorded, its reward and wall time. A figure, not a gate: the base
   model rarely writes Terminus-2's JSON.

Run from the repository root after ``scripts/setup.sh``::

    .venv/bin/python benchmarks/terminus_2.py                  # a table
    .venv/bin/python benchmarks/terminus_2.py --json           # one JSON object
    .venv/bin/python benchmarks/terminus_2.py --dry-run        # what it would run

No goal: it exits 0 when every part ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _runs import RLLM, ROOT, stage
from _tables import right_aligned

PLAN = ROOT / "examples" / "terminus-2" / "plan.toml"


def episode_command(limit: int) -> list[str]:
    # The example trains on every shipped shell task and holds none out: evaluate a train one.
    made = [str(RLLM), "eval", str(PLAN), "--json", "--split", "train"]
    return [*made, "--limit", str(limit), "--attempts", "1"]


def summarize(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "count": len(ordered),
        "median_ms": statistics.median(ordered) * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "p95_ms": ordered[int(0.95 * (len(ordered) - 1))] * 1e3,
    }


async def time_isolation(isolation: str, command: str, count: int) -> dict[str, Any]:
    from rllm_core.plugins import PluginManager
    from rllm_core.types import SandboxSpec
    from rllm_harness_terminus_2.harness import Terminus2Harness

    manager = PluginManager(disabled=())
    backend = manager.get("sandbox_backend", "local").build({"isolation": isolation})
    harness = Terminus2Harness()
    with tempfile.TemporaryDirectory(prefix="rllm-bench-t2-") as folder:
        # Without isolation the workdir is a host folder; bubblewrap makes /app private.
        workdir = str(Path(folder)) if isolation == "none" else "/app"
        try:
            sandbox = await backend.create(SandboxSpec(workdir=workdir))
            await harness.time_bridge(sandbox, command=command, count=5)  # warm both paths
            direct = []
            for _ in range(count):
                began = time.perf_counter()
                await sandbox.exec(command, timeout=30.0)
                direct.append(time.perf_counter() - began)
            bridged = await harness.time_bridge(sandbox, command=command, count=count)
        finally:
            await harness.close()
            await backend.close()
    baseline, through = summarize(direct), summarize(bridged)
    return {
        "direct": baseline,
        "bridge": through,
        "overhead_median_ms": through["median_ms"] - baseline["median_ms"],
    }


def bwrap_works() -> str | None:
    try:
        from rllm_sandbox_backend_local.bwrap import probe
    except ImportError:
        return "the local sandbox backend is not installed"
    return probe("bwrap")


def real_episode(limit: int) -> dict[str, Any]:
    measured = stage(episode_command(limit))
    summary = measured["summary"]
    eval_dir = Path(summary["run_folder"]) if "run_folder" in summary else None
    results = []
    if eval_dir is not None:
        if not eval_dir.is_absolute():
            eval_dir = ROOT / eval_dir
        lines = (eval_dir / "results.jsonl").read_text().splitlines()
        results = [json.loads(line) for line in lines]
    return {
        "wall_s": measured["wall_s"],
        "peak_rss_gb": measured["peak_rss_gb"],
        "eval_dir": str(eval_dir) if eval_dir else None,
        "tasks": [
            {"task_id": r["task_id"], "terminations": r["terminations"], "rewards": r["rewards"]}
            for r in results
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200, help="commands timed per path")
    parser.add_argument("--command", default="true", help="the command timed")
    parser.add_argument("--limit", type=int, default=1, help="tasks of the real episode")
    parser.add_argument("--skip-episode", action="store_true", help="only time the bridge")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dry-run", action="store_true", help="print what would run")
    args = parser.parse_args(argv)
    isolations = ["none"]
    why_not = bwrap_works()
    if why_not is None:
        isolations.append("bwrap")
    if args.dry_run:
        for isolation in isolations:
            print(
                f"time {args.count} x {args.command!r}: sandbox.exec, then the bridge"
                f" (local, isolation={isolation})"
            )
        if not args.skip_episode:
            print(shlex.join(episode_command(args.limit)))
        return 0
    report: dict[str, Any] = {"command": args.command, "bridge": {}}
    for isolation in isolations:
        report["bridge"][isolation] = asyncio.run(
            time_isolation(isolation, args.command, args.count)
        )
    if why_not is not None:
        report["bwrap_skipped"] = why_not
    if not args.skip_episode:
        report["episode"] = real_episode(args.limit)
    if args.json:
        print(json.dumps(report))
        return 0
    rows = []
    for isolation, figures in report["bridge"].items():
        for path in ("direct", "bridge"):
            f = figures[path]
            rows.append(
                [
                    f"{isolation}: {'sandbox.exec' if path == 'direct' else 'through the bridge'}",
                    f"{f['median_ms']:.2f}",
                    f"{f['mean_ms']:.2f}",
                    f"{f['p95_ms']:.2f}",
                ]
            )
    print(f"{args.count} x {args.command!r}")
    for line in right_aligned(["path", "median ms", "mean ms", "p95 ms"], rows, left=1):
        print(line)
    for isolation, figures in report["bridge"].items():
        print(f"bridge overhead ({isolation}): {figures['overhead_median_ms']:+.2f} ms a command")
    if "episode" in report:
        episode = report["episode"]
        for task in episode["tasks"]:
            print(
                f"real episode: {task['task_id']}: {', '.join(task['terminations'])},"
                f" reward {task['rewards']}, {episode['wall_s']:.0f} s wall,"
                f" peak {episode['peak_rss_gb']:.2f} GB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
