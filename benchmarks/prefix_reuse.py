"""The torch sampler's prefix reuse on multi-turn episodes: an evaluation with and without it.

Runs ``rllm-core eval examples/agent-quickstart/rl.toml`` (the shell harness in bubblewrap
sandboxes, up to 4 turns an episode, the torch sampler) twice back to back on the same model
and tasks: with ``[trainer].prefix_cache_mb = 0`` (every turn runs its whole conversation
through the model) and with the default (a turn runs only its new tokens). Reported for each:
wall seconds, the sampler's episodes per second, peak RSS and pass@1 (the same seeds, so the
two agree up to the rare token that rounding moves).

Run from the repository root after ``scripts/setup.sh`` and the agent quickstart's SFT
(``rllm-core sft examples/agent-quickstart/sft.toml``; ``--model`` names another model)::

    .venv/bin/python benchmarks/prefix_reuse.py                 # a table
    .venv/bin/python benchmarks/prefix_reuse.py --json          # one JSON object
    .venv/bin/python benchmarks/prefix_reuse.py --dry-run       # the commands only

Goal (exit 1 when missed): the evaluation with reuse at least 1.5x as fast.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from _runs import RLLM, ROOT, stage
from _tables import right_aligned

PLAN = ROOT / "examples" / "agent-quickstart" / "rl.toml"
GOAL_SPEEDUP = 1.5


def command(args: argparse.Namespace, cache_mb: int | None) -> list[str]:
    made = [str(RLLM), "eval", str(PLAN), "--json", "--attempts", str(args.attempts)]
    made += ["--limit", str(args.limit), "--set", f'trainer.model="{args.model}"']
    if cache_mb is not None:
        made += ["--set", f"trainer.prefix_cache_mb={cache_mb}"]
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        default=str(PLAN.parent / "runs" / "sft-model"),
        help="trainer.model of the eval (default: the agent quickstart's SFT export)",
    )
    parser.add_argument("--limit", type=int, default=16, help="held-out tasks evaluated")
    parser.add_argument("--attempts", type=int, default=4, help="episodes per task")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    variants = {"no reuse": command(args, 0), "reuse (default)": command(args, None)}
    if args.dry_run:
        for made in variants.values():
            print(shlex.join(made))
        return 0
    results: dict[str, Any] = {}
    for name, made in variants.items():
        measured = stage(made)
        summary = measured["summary"]
        results[name] = {
            "wall_s": measured["wall_s"],
            "episodes": summary["episodes"],
            "episodes_per_s": summary["episodes"] / measured["wall_s"],
            "peak_rss_gb": measured["peak_rss_gb"],
            "pass_at_1": summary["pass@1"],
        }
    speedup = results["no reuse"]["wall_s"] / results["reuse (default)"]["wall_s"]
    report = {"runs": results, "speedup": speedup, "goal_speedup": GOAL_SPEEDUP}
    if args.json:
        print(json.dumps(report))
    else:
        rows = [
            [
                name,
                f"{r['wall_s']:.0f}",
                f"{r['episodes_per_s']:.2f}",
                f"{r['peak_rss_gb']:.2f}",
                f"{r['pass_at_1']:.3f}",
            ]
            for name, r in results.items()
        ]
        headers = ["sampler", "wall s", "episodes/s", "peak GB", "pass@1"]
        for line in right_aligned(headers, rows, left=1):
            print(line)
        print(f"speedup {speedup:.2f}x (goal >= {GOAL_SPEEDUP}x)")
    return 0 if speedup >= GOAL_SPEEDUP else 1


if __name__ == "__main__":
    sys.exit(main())
