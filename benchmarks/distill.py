"""On-policy distillation against RL from the reward, on the quickstart's arithmetic tasks.

First ``examples/distill/teacher.toml`` trains SmolLM2 by GRPO from the reward alone and exports
it as the teacher (``[run].export``); that run's held-out curve is the RL-from-the-reward line.
Then ``examples/distill/plan.toml`` distills the teacher into the base SmolLM2 (``advantage =
distill``: the teacher's per-token signal, no reward). Both runs are their own processes with
the same seed, tasks, batch and ``--steps`` and score the held-out split after every step
(``[run].eval_every = 1``). Last, ``rllm-core eval`` scores the exported teacher on the same
split: the line to reach. The table prints ``eval/mean_reward`` per step side by side and, for
each method, the first step at or above the teacher's held-out reward::

    .venv/bin/python benchmarks/distill.py               # a table
    .venv/bin/python benchmarks/distill.py --json        # one JSON object
    .venv/bin/python benchmarks/distill.py --dry-run     # the commands only

With ``--teacher DIR`` the GRPO run exports nothing and ``DIR`` is the teacher.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from _runs import RLLM, ROOT, stage

PLAN = ROOT / "examples" / "distill" / "plan.toml"
TEACHER_PLAN = ROOT / "examples" / "distill" / "teacher.toml"
METHODS = ("distill", "grpo")


def _settings(out: Path, method: str, args: argparse.Namespace) -> list[str]:
    return [
        f'run.output_dir="{out / method}"',
        f"run.steps={args.steps}",
        "run.eval_every=1",
        f"algorithm.batch_size={args.batch_size}",
        f"algorithm.group_size={args.group_size}",
    ]


def _command(plan: Path, subcommand: str, settings: list[str]) -> list[str]:
    command = [str(RLLM), subcommand, str(plan), "--json"]
    for setting in settings:
        command += ["--set", setting]
    return command


def grpo_command(out: Path, teacher: Path, args: argparse.Namespace) -> list[str]:
    settings = _settings(out, "grpo", args)
    if args.teacher is None:
        settings.append(f'run.export="{teacher}"')
    return _command(TEACHER_PLAN, "run", settings)


def distill_command(out: Path, teacher: Path, args: argparse.Namespace) -> list[str]:
    settings = _settings(out, "distill", args)
    settings.append(f'algorithm.advantage.teacher.model="{teacher}"')
    return _command(PLAN, "run", settings)


def eval_command(out: Path, teacher: Path) -> list[str]:
    return _command(
        PLAN,
        "eval",
        [
            f'trainer.model="{teacher}"',
            f'algorithm.advantage.teacher.model="{teacher}"',
            f'run.output_dir="{out / "teacher-eval"}"',
        ],
    )


def curve(runs: Path) -> list[float | None]:
    (run_dir,) = sorted(p for p in runs.iterdir() if p.is_dir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r.get("eval/mean_reward") for r in rows]


def first_step_reaching(values: list[float | None], line: float) -> int | None:
    """The first step (from 1) whose value is at least ``line``; None when none is."""
    return next((i for i, v in enumerate(values, 1) if v is not None and v >= line), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--teacher", type=Path, help="a teacher model folder (no export)")
    parser.add_argument("--out", type=Path, help="where runs go (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path("<out>") if args.dry_run else Path(tempfile.mkdtemp(prefix="distill-"))
    out = args.out.absolute()
    teacher = (args.teacher or out / "teacher-model").absolute()
    runs = {
        "grpo": grpo_command(out, teacher, args),
        "distill": distill_command(out, teacher, args),
    }
    teacher_eval_command = eval_command(out, teacher)
    if args.dry_run:
        for command in (runs["grpo"], runs["distill"], teacher_eval_command):
            print(shlex.join(command))
        return 0
    walls = {method: stage(runs[method])["wall_s"] for method in ("grpo", "distill")}
    teacher_eval = stage(teacher_eval_command)["summary"]
    line = float(teacher_eval["mean_reward"])
    curves = {m: curve(out / m) for m in METHODS}
    reached = {m: first_step_reaching(curves[m], line) for m in METHODS}
    record: dict[str, Any] = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "teacher": str(teacher),
        "teacher_eval": teacher_eval,
        "eval_mean_reward": curves,
        "first_step_at_teacher": reached,
        "wall_s": walls,
    }
    if args.json:
        print(json.dumps(record))
        return 0
    print("held-out eval/mean_reward per step (same tasks, seed and batch)")
    print(f"{'step':>4}  {'distill':>8}  {'grpo':>8}")
    for step, (a, b) in enumerate(zip(curves["distill"], curves["grpo"], strict=True), 1):
        show = [f"{v:8.3f}" if isinstance(v, float) else f"{'-':>8}" for v in (a, b)]
        print(f"{step:>4}  {show[0]}  {show[1]}")
    print(f"teacher held-out mean reward: {line:.3f}")
    for method in METHODS:
        print(f"first step at or above it, {method}: {reached[method] or 'none'}")
    print(f"wall s: distill {walls['distill']:.0f}, grpo {walls['grpo']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
