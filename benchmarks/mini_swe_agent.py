"""The shipped mini-swe-agent example (``examples/mini-swe-agent/plan.toml``): seconds per step
and peak memory, against what the example did before.

Runs ``rllm-core run`` of the example for ``--steps`` steps (2 by default, no checkpoints) as
its own process; with ``--before``, first also for one step of the plan with the settings it
first shipped with (16 episodes of up to 6 calls a step, 4 at a time, one CPU thread, no
prefix reuse, padded micro-batches of 4; written to ``before.toml`` in the output folder:
expect 20 minutes or more). Reported per run: seconds per step (rollout and training), peak
RSS of the process, episodes, sampled and trained tokens per step, and how the episodes
ended.

Run from the repository root after ``scripts/setup.sh`` (needs bubblewrap)::

    .venv/bin/python benchmarks/mini_swe_agent.py                  # a table
    .venv/bin/python benchmarks/mini_swe_agent.py --json           # one JSON object
    .venv/bin/python benchmarks/mini_swe_agent.py --before         # and the old settings
    .venv/bin/python benchmarks/mini_swe_agent.py --dry-run        # the commands only

Goals (exit 1 when one is missed, shipped plan): a step within 3 minutes, peak RSS <= 4 GB.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import tomli_w
from _runs import RLLM, ROOT, stage
from _tables import right_aligned

PLAN = ROOT / "examples" / "mini-swe-agent" / "plan.toml"
STEP_GOAL_S = 180.0
RSS_GOAL_GB = 4.0
# The example as it first shipped: 4 tasks a step, 6 calls an episode, 4 at a time, one CPU
# thread, no prefix reuse, padded micro-batches of 4 without a token bound or recomputation.
BEFORE_CHANGES = {
    "algorithm": {"batch_size": 4},
    "rollout": {"max_concurrency": 4},
    "harness": {"step_limit": 6},
}
BEFORE_TRAINER_KEYS = ("name", "model", "device", "learning_rate", "lora", "max_batch_size")
BEFORE_TRAINER = {"micro_batch_size": 4, "cpu_threads": 1, "prefix_cache_mb": 0}


def before_plan(out: Path) -> Path:
    """Write the example's plan with its first settings to ``out``; returns its path."""
    plan = tomllib.loads(PLAN.read_text())
    for section, values in BEFORE_CHANGES.items():
        plan[section].update(values)
    plan["trainer"] = {
        **{key: plan["trainer"][key] for key in BEFORE_TRAINER_KEYS},
        **BEFORE_TRAINER,
    }
    plan["tasks"]["path"] = str((PLAN.parent / plan["tasks"]["path"]).resolve())
    out.mkdir(parents=True, exist_ok=True)
    written = out / "before.toml"
    written.write_text(tomli_w.dumps(plan))
    return written


def command(plan: Path, out: Path, steps: int) -> list[str]:
    made = [str(RLLM), "run", str(plan), "--json"]
    for setting in (f"run.output_dir={out}", f"run.steps={steps}", "run.save_every=0"):
        made += ["--set", setting]
    return made


def figures(run_dir: Path, measured: dict[str, Any]) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ends: Counter[str] = Counter()
    for line in (run_dir / "episodes.jsonl").read_text().splitlines():
        ends[json.loads(line).get("termination", "unknown")] += 1
    count = len(rows)
    return {
        "run_dir": str(run_dir),
        "steps": count,
        "step_s": sum(float(r["time/step_s"]) for r in rows) / count,
        "rollout_s": sum(float(r["time/rollout_s"]) for r in rows) / count,
        "train_s": sum(float(r["time/train_s"]) for r in rows) / count,
        "episodes_per_step": sum(float(r["episodes"]) for r in rows) / count,
        "sampled_tokens_per_step": sum(float(r["tokens/sampled"]) for r in rows) / count,
        "trained_tokens_per_step": sum(float(r["tokens/trained"]) for r in rows) / count,
        "rewards": [float(r["reward/mean"]) for r in rows],
        "terminations": dict(ends),
        "wall_s": measured["wall_s"],
        "peak_rss_gb": measured["peak_rss_gb"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--before", action="store_true", help="also run one step with the old settings first"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="run folders go here (default: mini-swe-agent-bench in the temp folder)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    out = args.output_dir or Path(tempfile.gettempdir()) / "mini-swe-agent-bench"
    commands = {"shipped": command(PLAN, out / "shipped", args.steps)}
    if args.before:
        commands = {"before": command(before_plan(out), out / "before", 1), **commands}
    if args.dry_run:
        for name, made in commands.items():
            print(f"{name}: {shlex.join(made)}")
        return 0

    results = {}
    for name, made in commands.items():
        if not args.json:
            print(f"running: {shlex.join(made)}", file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)
        measured = stage(made)
        results[name] = figures(Path(measured["summary"]["run_folder"]), measured)
    shipped = results["shipped"]
    goals = {
        f"step <= {STEP_GOAL_S:.0f} s": shipped["step_s"] <= STEP_GOAL_S,
        f"peak RSS <= {RSS_GOAL_GB} GB": shipped["peak_rss_gb"] <= RSS_GOAL_GB,
    }
    if args.json:
        print(json.dumps({"runs": results, "goals": goals}))
    else:
        rows = [
            [
                name,
                f"{r['step_s']:.0f}",
                f"{r['rollout_s']:.0f}",
                f"{r['train_s']:.0f}",
                f"{r['peak_rss_gb']:.2f}",
                f"{r['episodes_per_step']:.0f}",
                f"{r['sampled_tokens_per_step']:.0f}",
                f"{r['trained_tokens_per_step']:.0f}",
                " ".join(f"{k}:{v}" for k, v in sorted(r["terminations"].items())),
            ]
            for name, r in results.items()
        ]
        headers = [
            "plan",
            "step s",
            "rollout s",
            "train s",
            "peak GB",
            "episodes",
            "sampled",
            "trained tokens",
            "ends",
        ]
        for line in right_aligned(headers, rows, left=1):
            print(line)
        for goal, met in goals.items():
            print(f"goal {goal}: {'met' if met else 'MISSED'}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
