"""The quickstart's learning and time goals, with the bare GRPO loop as the baseline.

Runs, one after the other, each as its own process from the repository root:

1. ``benchmarks/bare_grpo.py``: the same model, tasks, reward, seed, batch shape and optimizer
   as ``examples/quickstart/plan.toml`` in a hand-written GRPO loop (``model.generate``, no
   framework in the path): the baseline the framework must match (skip with
   ``--no-baseline``);
2. ``rllm-core run examples/quickstart/plan.toml --plain``: the framework with all its parts
   (gateway, harness, sandbox, verifier, trace store, datum builder, trainer backend); its
   wall time is the command's, model load and process start included;
3. ``rllm-core eval`` on the plan's held-out split, ``--attempts 4``, for the base model and
   for the run's final checkpoint;
4. the same run with ``--set run.deterministic=false`` (skip with ``--no-speed-mode``): the
   reproducible numerics (``[run].deterministic``, the plan default) must cost at most 5% of
   the wall time of the libraries' default modes.

Goals (the issue's): the mean reward of the last 5 steps exceeds the first 5 by >= 0.25; the
trained checkpoint's held-out mean reward beats the base model's by >= 0.20; the run finishes in
<= 8 minutes; the sampler is busy >= 70% of the rollout phases' wall time (the run's
``sampler_utilization``: prefill and decode seconds over rollout seconds, summed over steps);
the deterministic run's wall time is within 5% of the speed-mode run's. With ``--world-size N``
the runs train in N processes (``[trainer].parallel.world_size``, launched by ``rllm-core run``
through torchrun): the same goals, for the plan run as one node of several ranks.
The baseline's figures sit next to the framework's for comparison; they are not goals. So does
each process's peak resident memory (``peak_rss_gb``: the kernel's high-water mark of the
process, model load included, read from ``wait4`` when it exits).

Everything is written under ``--output-dir`` (a temporary folder by default; the run and eval
folders are kept there for inspection when it is given)::

    .venv/bin/python benchmarks/quickstart.py              # a table, about 15 minutes
    .venv/bin/python benchmarks/quickstart.py --json       # one JSON object
    .venv/bin/python benchmarks/quickstart.py --no-baseline

Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_core.run.checkpoints import checkpoint_folder

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"
EVAL_ATTEMPTS = 4
GOALS = {
    "reward_gain": 0.25,
    "eval_gain": 0.20,
    "wall_s": 8 * 60.0,
    "sampler_utilization": 0.70,
    "deterministic_overhead": 0.05,
}


def measured(
    command: Sequence[str], *, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``command`` to its end: its result, wall seconds and peak resident memory in GB
    (``ru_maxrss`` of the process as ``wait4`` reports it, kilobytes on Linux)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.monotonic() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())
    return result, elapsed, usage.ru_maxrss * 1024 / 1e9


def _cli(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float, float]:
    result, elapsed, peak_rss_gb = measured(
        [sys.executable, "-m", "rllm_core.cli", *args],
        cwd=cwd,
        env=dict(os.environ, COLUMNS="200"),
    )
    if result.returncode != 0:
        raise SystemExit(
            f"rllm-core {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}"
        )
    return result, elapsed, peak_rss_gb


def _only_folder(parent: Path, pattern: str) -> Path:
    found = sorted(parent.glob(pattern))
    if len(found) != 1:
        raise SystemExit(f"expected one folder matching {parent / pattern}, found {found}")
    return found[0]


def baseline() -> dict[str, Any]:
    result, wall_s, peak_rss_gb = measured(
        [sys.executable, str(ROOT / "benchmarks" / "bare_grpo.py"), "--json"], cwd=ROOT
    )
    if result.returncode != 0:
        raise SystemExit(f"bare_grpo.py exited {result.returncode}:\n{result.stderr[-4000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["process_wall_s"] = wall_s
    figures["peak_rss_gb"] = peak_rss_gb
    return figures


def _parallel(world_size: int) -> list[str]:
    return [] if world_size == 1 else ["--set", f"trainer.parallel={{world_size = {world_size}}}"]


def speed_mode(out: Path, world_size: int = 1) -> dict[str, Any]:
    """The quickstart run with ``run.deterministic = false``: wall, rollout and train time."""
    runs = out / "runs-speed-mode"
    _, wall_s, _ = _cli(
        "run",
        str(PLAN),
        "--plain",
        "--set",
        f"run.output_dir={runs}",
        "--set",
        "run.deterministic=false",
        *_parallel(world_size),
        cwd=ROOT,
    )
    run_dir = _only_folder(runs, "quickstart-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    numerics = json.loads((run_dir / "numerics.json").read_text())
    return {
        "mkl_cbwr": numerics["components"]["[trainer]"].get("mkl_cbwr"),
        "wall_s": wall_s,
        "rollout_s": summary["rollout_s"],
        "train_s": summary["train_s"],
        "last5_reward": summary["reward_last"],
    }


def framework(out: Path, world_size: int = 1) -> dict[str, Any]:
    runs = out / "runs"
    _, wall_s, peak_rss_gb = _cli(
        "run",
        str(PLAN),
        "--plain",
        "--set",
        f"run.output_dir={runs}",
        *_parallel(world_size),
        cwd=ROOT,
    )
    run_dir = _only_folder(runs, "quickstart-*")
    numerics = json.loads((run_dir / "numerics.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = checkpoint_folder(run_dir)
    evals = {}
    for label, extra in (("base", ()), ("trained", ("--checkpoint", str(final)))):
        target = out / f"eval-{label}"
        _, eval_wall, _ = _cli(
            "eval",
            str(PLAN),
            "--plain",
            "--attempts",
            str(EVAL_ATTEMPTS),
            "--set",
            f"run.output_dir={target}",
            *extra,
            cwd=ROOT,
        )
        result = json.loads((_only_folder(target, "*") / "summary.json").read_text())
        evals[label] = {
            "mean_reward": result["mean_reward"],
            "pass@1": result["pass@1"],
            f"pass@{EVAL_ATTEMPTS}": result[f"pass@{EVAL_ATTEMPTS}"],
            "infra_failures": result["infra_failures"],
            "wall_s": eval_wall,
        }
    return {
        "run_dir": str(run_dir),
        "mkl_cbwr": numerics["components"]["[trainer]"].get("mkl_cbwr"),
        "checkpoint": str(final),
        "wall_s": wall_s,
        "peak_rss_gb": peak_rss_gb,
        "first5_reward": summary["reward_first"],
        "last5_reward": summary["reward_last"],
        "rewards": [row["reward/mean"] for row in metrics],
        "rollout_s": summary["rollout_s"],
        "train_s": summary["train_s"],
        "sampler_utilization": summary.get("sampler_utilization"),
        "sampler_utilization_by_step": [row.get("sampler_utilization") for row in metrics],
        "infra_failures": summary["infra_failures"],
        "eval": evals,
    }


def judge(figures: dict[str, Any]) -> dict[str, bool]:
    run = figures["framework"]
    utilization = run["sampler_utilization"]
    return {
        "reward_gain": run["last5_reward"] - run["first5_reward"] >= GOALS["reward_gain"],
        "eval_gain": run["eval"]["trained"]["mean_reward"] - run["eval"]["base"]["mean_reward"]
        >= GOALS["eval_gain"],
        "wall_s": run["wall_s"] <= GOALS["wall_s"],
        "sampler_utilization": utilization is not None
        and utilization >= GOALS["sampler_utilization"],
    } | (
        {"deterministic_overhead": overhead(figures) <= GOALS["deterministic_overhead"]}
        if "speed_mode" in figures
        else {}
    )


def overhead(figures: dict[str, Any]) -> float:
    """Wall time of the deterministic run over the speed-mode run's, minus 1."""
    return figures["framework"]["wall_s"] / figures["speed_mode"]["wall_s"] - 1.0


def _fmt(value: float | None, digits: int = 3, sign: str = "") -> str:
    return "n/a" if value is None else f"{value:{sign}.{digits}f}"


def table(figures: dict[str, Any]) -> str:
    run, base, met = figures["framework"], figures.get("baseline"), figures["met"]

    def verdict(key: str) -> str:
        return "met" if met[key] else "MISSED"

    gain = run["last5_reward"] - run["first5_reward"]
    held_out = run["eval"]["trained"]["mean_reward"] - run["eval"]["base"]["mean_reward"]
    base_split = f"{base['rollout_s']:.0f} / {base['train_s']:.0f}" if base else "n/a"
    lines = [
        f"{'figure':<44} {'rllm-core run':>14} {'bare GRPO loop':>15} {'goal':>8}  result",
        f"{'mean reward, first 5 steps':<44} {_fmt(run['first5_reward']):>14}"
        f" {_fmt(base and base['first5_reward']):>15}",
        f"{'mean reward, last 5 steps':<44} {_fmt(run['last5_reward']):>14}"
        f" {_fmt(base and base['last5_reward']):>15}",
        f"{'last 5 minus first 5':<44} {gain:>+14.3f}"
        f" {_fmt(base and base['last5_reward'] - base['first5_reward'], sign='+'):>15}"
        f" {'>= 0.25':>8}  {verdict('reward_gain')}",
        f"{'held-out mean reward, base model':<44} {_fmt(run['eval']['base']['mean_reward']):>14}",
        f"{'held-out mean reward, final checkpoint':<44}"
        f" {_fmt(run['eval']['trained']['mean_reward']):>14}",
        f"{'held-out gain over the base model':<44} {held_out:>+14.3f} {'':>15}"
        f" {'>= 0.20':>8}  {verdict('eval_gain')}",
        f"{'wall time, s (model load included)':<44} {run['wall_s']:>14.0f}"
        f" {_fmt(base and base['process_wall_s'], 0):>15} {'<= 480':>8}  {verdict('wall_s')}",
        f"{'peak resident memory, GB':<44} {run['peak_rss_gb']:>14.2f}"
        f" {_fmt(base and base['peak_rss_gb'], 2):>15}",
        f"{'rollout / train time, s':<44}"
        f" {run['rollout_s']:>6.0f} / {run['train_s']:<5.0f}"
        f" {base_split:>15}",
        f"{'sampler busy share of rollout time':<44} {_fmt(run['sampler_utilization'], 2):>14}"
        f" {'':>15} {'>= 0.70':>8}  {verdict('sampler_utilization')}",
    ]
    fast = figures.get("speed_mode")
    if fast:
        lines += [
            "",
            f"{'reproducible numerics':<44} {'deterministic':>14} {'speed mode':>15} {'goal':>8}",
            f"{'MKL mode as MKL reports it':<44} {run['mkl_cbwr']!s:>14} {fast['mkl_cbwr']!s:>15}",
            f"{'wall time, s':<44} {run['wall_s']:>14.0f} {fast['wall_s']:>15.0f}",
            f"{'rollout / train time, s':<44} {run['rollout_s']:>6.0f} / {run['train_s']:<5.0f}"
            f" {fast['rollout_s']:>7.0f} / {fast['train_s']:<5.0f}",
            f"{'deterministic overhead on wall time':<44} {overhead(figures):>+14.1%} {'':>15}"
            f" {'<= 5%':>8}  {verdict('deterministic_overhead')}",
        ]
    lines += ["", f"trainer processes: {figures['world_size']}", f"run folder: {run['run_dir']}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-baseline", action="store_true", help="skip the bare GRPO loop")
    parser.add_argument(
        "--no-speed-mode",
        action="store_true",
        help="skip the run with run.deterministic=false",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="keep the run and eval folders here"
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="train in this many processes ([trainer].parallel.world_size; 1: one process)",
    )
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {
        "plan": str(PLAN.relative_to(ROOT)),
        "world_size": args.world_size,
        "goals": GOALS,
    }
    if not args.no_baseline:
        figures["baseline"] = baseline()
    with tempfile.TemporaryDirectory(prefix="rllm-quickstart-") as scratch:
        out = (args.output_dir or Path(scratch)).resolve()
        out.mkdir(parents=True, exist_ok=True)
        figures["framework"] = framework(out, args.world_size)
        if not args.no_speed_mode:
            figures["speed_mode"] = speed_mode(out, args.world_size)
    figures["met"] = judge(figures)
    print(json.dumps(figures) if args.json else table(figures))
    return 0 if all(figures["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
