"""Dynamic sampling on the quickstart: ``[algorithm].filter_groups`` off and on, back to back.

Runs ``examples/quickstart/plan.toml`` twice, each as its own process from the repository root
(``rllm-core run ... --plain --set run.steps=N --set algorithm.filter_groups=...``): first with
``"none"`` (every group trained, those with equal rewards included), then with
``"zero-variance"`` (such groups left out and the batch refilled with more tasks, at most
``--max-sample-batches`` rounds a step). For each run: the mean ``reward/mean`` of the first
and last 5 steps (over every episode rolled out, so the filtered groups count), the command's
wall seconds, rollout and train seconds per step, and the groups rolled out, with equal
rewards, and left out.

Goals: the filtered run's last-5 reward is at least the unfiltered one's, at no more than 1.3x
its wall time::

    .venv/bin/python benchmarks/filter_groups.py             # a table
    .venv/bin/python benchmarks/filter_groups.py --json      # one JSON object
    .venv/bin/python benchmarks/filter_groups.py --dry-run   # the commands only

Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _runs import QUICKSTART, ROOT, quickstart_command, run_quickstart
from _tables import right_aligned

MODES = ("none", "zero-variance")
WALL_GOAL = 1.3


def command(out: Path, mode: str, steps: int, max_sample_batches: int) -> list[str]:
    settings = [f'algorithm.filter_groups="{mode}"']
    if mode != "none":
        settings.append(f"algorithm.max_sample_batches={max_sample_batches}")
    return quickstart_command(out / mode / "runs", steps, *settings)


def judge(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    off, on = runs["none"], runs["zero-variance"]
    wall_ratio = on["wall_s"] / off["wall_s"]
    return {
        "last5_gain": on["last5_reward"] - off["last5_reward"],
        "wall_ratio": wall_ratio,
        "reward_met": on["last5_reward"] >= off["last5_reward"],
        "wall_met": wall_ratio <= WALL_GOAL,
    }


def table(figures: dict[str, Any]) -> str:
    rows = []
    for mode, run in figures["runs"].items():
        groups = run["groups"]
        sampled = groups["groups/sampled"] or groups["groups"]
        rows.append(
            [
                mode,
                f"{run['first5_reward']:.3f}",
                f"{run['last5_reward']:.3f}",
                f"{run['wall_s']:.0f}",
                f"{run['rollout_s_per_step']:.2f}",
                f"{run['train_s_per_step']:.2f}",
                f"{sampled:.0f}",
                f"{groups['zero_variance_groups']:.0f}",
                f"{groups['groups/filtered']:.0f}",
            ]
        )
    headers = [
        "filter_groups",
        "reward first 5",
        "reward last 5",
        "wall s",
        "rollout s/step",
        "train s/step",
        "groups rolled out",
        "equal rewards",
        "left out",
    ]
    verdict = figures["verdict"]
    lines = [*right_aligned(headers, rows, left=1), ""]
    lines += [
        f"last-5 reward, filtered minus not: {verdict['last5_gain']:+.3f}"
        f"  (goal >= 0: {'met' if verdict['reward_met'] else 'MISSED'})",
        f"wall time, filtered over not: {verdict['wall_ratio']:.2f}x"
        f"  (goal <= {WALL_GOAL}x: {'met' if verdict['wall_met'] else 'MISSED'})",
        f"steps: {figures['steps']}; max_sample_batches: {figures['max_sample_batches']}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=13, help="run.steps of both runs")
    parser.add_argument(
        "--max-sample-batches", type=int, default=3, help="rollout rounds a step may take"
    )
    parser.add_argument("--output-dir", type=Path, default=None, help="where the runs go")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.output_dir is not None:
        out = args.output_dir.resolve()
    elif args.dry_run:
        out = Path(tempfile.gettempdir()) / "rllm-filter-groups"
    else:
        out = Path(tempfile.mkdtemp(prefix="rllm-filter-groups-"))
    commands = {mode: command(out, mode, args.steps, args.max_sample_batches) for mode in MODES}
    if args.dry_run:
        for line in commands.values():
            print(shlex.join(line))
        return 0
    runs = {mode: run_quickstart(line, out / mode / "runs") for mode, line in commands.items()}
    figures = {
        "plan": str(QUICKSTART.relative_to(ROOT)),
        "steps": args.steps,
        "max_sample_batches": args.max_sample_batches,
        "runs": runs,
        "verdict": judge(runs),
    }
    print(json.dumps(figures) if args.json else table(figures))
    verdict = figures["verdict"]
    return 0 if verdict["reward_met"] and verdict["wall_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
