"""On-policy distillation against RL from the reward, on the quickstart's arithmetic tasks.

First ``rllm-core sft examples/distill/teacher.toml`` exports the teacher (SmolLM2 fine-tuned on
correct arithmetic transcripts) unless ``--teacher`` names a model folder. Then
``examples/distill/plan.toml`` runs twice from the base SmolLM2, each as its own process for the
same ``--steps`` with the same seed, tasks and batch: once with ``advantage = distill`` (the
teacher's per-token signal, no reward) and once with ``advantage = grpo`` (the reward alone). Both
evaluate the held-out split after every step (``[run].eval_every = 1``); the table prints
``eval/mean_reward`` per step side by side, and the teacher's own held-out reward (``rllm-core
eval``) as the line to reach::

    .venv/bin/python benchmarks/distill.py               # a table
    .venv/bin/python benchmarks/distill.py --json        # one JSON object
    .venv/bin/python benchmarks/distill.py --dry-run     # the commands only
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


def teacher_command(out: Path) -> list[str]:
    return [str(RLLM), "sft", str(TEACHER_PLAN), "--json", "--set", f'sft.export="{out}"']


def run_command(out: Path, method: str, teacher: Path, args: argparse.Namespace) -> list[str]:
    command = [str(RLLM), "run", str(PLAN), "--json"]
    settings = [
        f'run.output_dir="{out / method}"',
        f"run.steps={args.steps}",
        "run.eval_every=1",
        f"algorithm.batch_size={args.batch_size}",
        f"algorithm.group_size={args.group_size}",
        f'algorithm.advantage.teacher.model="{teacher}"',
    ]
    if method == "grpo":
        settings[-1] = 'algorithm.advantage={ name = "grpo", normalize_std = true }'
    for setting in settings:
        command += ["--set", setting]
    return command


def eval_command(out: Path, teacher: Path) -> list[str]:
    return [
        str(RLLM),
        "eval",
        str(PLAN),
        "--json",
        "--set",
        f'trainer.model="{teacher}"',
        "--set",
        f'algorithm.advantage.teacher.model="{teacher}"',
        "--set",
        f'run.output_dir="{out / "teacher-eval"}"',
    ]


def curve(runs: Path) -> list[float | None]:
    (run_dir,) = sorted(runs.glob("distill-*"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r.get("eval/mean_reward") for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--teacher", type=Path, help="a teacher model folder (skips the SFT)")
    parser.add_argument("--out", type=Path, help="where runs go (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path("<out>") if args.dry_run else Path(tempfile.mkdtemp(prefix="distill-"))
    out = args.out.absolute()
    teacher = (args.teacher or out / "teacher-model").absolute()
    commands = [] if args.teacher else [teacher_command(teacher)]
    commands += [run_command(out, m, teacher, args) for m in METHODS]
    commands.append(eval_command(out, teacher))
    if args.dry_run:
        print("\n".join(shlex.join(c) for c in commands))
        return 0
    if not args.teacher:
        stage(commands[0])
    walls = {}
    for method, command in zip(METHODS, commands[-3:-1], strict=True):
        walls[method] = stage(command)["wall_s"]
    teacher_eval = stage(commands[-1])["summary"]
    curves = {m: curve(out / m) for m in METHODS}
    record: dict[str, Any] = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "teacher": str(teacher),
        "teacher_eval": teacher_eval,
        "eval_mean_reward": curves,
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
    print(f"teacher held-out: {json.dumps(teacher_eval)}")
    print(f"wall s: distill {walls['distill']:.0f}, grpo {walls['grpo']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
