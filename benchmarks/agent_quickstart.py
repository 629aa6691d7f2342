"""The agent quickstart (``examples/agent-quickstart``), stage by stage, with its figures.

Each stage runs as its own ``rllm-core`` process from the repository root, in this order:

1. ``rllm-core eval rl.toml`` of the base model (SmolLM2-135M-Instruct) on the held-out tasks;
2. ``rllm-core sft sft.toml`` (the SFT warm start), then ``eval`` of its export;
3. per seed, ``rllm-core run rl.toml`` from the SFT export with the first ``--modes``
   ``[algorithm].filter_groups`` mode (the recipe's), then ``eval`` of its last checkpoint; the
   other modes run for the first seed only, back to back with it, to compare.

Reported: held-out pass@1 (``--attempts`` per task, 4 by default) of every model; for each RL
run its reward per step, wall seconds, rollout and train seconds per step, cumulative-session
resets (the goal is 0), sampled tokens per episode, groups left out; every stage's wall
seconds and peak RSS (the process and what it waited for); and the RL gain (pass@1 after RL
minus before, against the SFT model it started from)::

    .venv/bin/python benchmarks/agent_quickstart.py                      # one seed, filtered
    .venv/bin/python benchmarks/agent_quickstart.py --seeds 0 1 2        # three seeds
    .venv/bin/python benchmarks/agent_quickstart.py --modes zero-variance none
    .venv/bin/python benchmarks/agent_quickstart.py --plot docs/images/agent-quickstart.png
    .venv/bin/python benchmarks/agent_quickstart.py --skip-base          # no base-model eval
    .venv/bin/python benchmarks/agent_quickstart.py --json               # one JSON object
    .venv/bin/python benchmarks/agent_quickstart.py --dry-run            # the commands only

Goals (exit 1 when one is missed), over the recipe's runs: every seed's RL gain >= 0.15 and
the first seed's >= 0.20; 0 resets; SFT plus one RL run and its evaluations within 25 minutes;
peak RSS <= 4 GB.
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

from _runs import stage
from _tables import right_aligned

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "examples" / "agent-quickstart"
RLLM = ROOT / ".venv" / "bin" / "rllm-core"
BASE_MODEL = "smollm2-135m-instruct"
GAIN_GOAL, GAIN_GOAL_EVERY_SEED = 0.20, 0.15
WALL_GOAL_S = 25 * 60
RSS_GOAL_GB = 4.0


def evaluate(attempts: int, *settings: str, checkpoint: Path | None = None) -> list[str]:
    command = [str(RLLM), "eval", str(HERE / "rl.toml"), "--attempts", str(attempts), "--json"]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    for setting in settings:
        command += ["--set", setting]
    return command


def commands(out: Path, seeds: Sequence[int], modes: Sequence[str], attempts: int) -> dict:
    sft_model = out / "sft-model"
    model = f'trainer.model="{sft_model}"'
    runs = {
        (seed, mode): [
            str(RLLM),
            "run",
            str(HERE / "rl.toml"),
            "--json",
            "--set",
            f"run.output_dir={out / 'runs' / f'{mode}-{seed}'}",
            "--set",
            f"run.seed={seed}",
            "--set",
            f'algorithm.filter_groups="{mode}"',
            "--set",
            model,
        ]
        for seed, mode in [(seed, modes[0]) for seed in seeds]
        + [(seeds[0], mode) for mode in modes[1:]]
    }
    return {
        "base": evaluate(attempts, f'trainer.model="{BASE_MODEL}"'),
        "sft": [
            str(RLLM),
            "sft",
            str(HERE / "sft.toml"),
            "--json",
            "--set",
            f"run.output_dir={out / 'sft-runs'}",
            "--set",
            f'sft.export="{sft_model}"',
        ],
        "sft_eval": evaluate(attempts, model),
        "runs": runs,
        "model": model,
    }


def rl_figures(run_dir: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = sum(float(r["episodes"]) for r in rows)
    return {
        "steps": len(rows),
        "rewards": [float(r["reward/mean"]) for r in rows],
        "rollout_s_per_step": sum(float(r["time/rollout_s"]) for r in rows) / len(rows),
        "train_s_per_step": sum(float(r["time/train_s"]) for r in rows) / len(rows),
        "resets": sum(float(r.get("resets", 0.0)) for r in rows),
        "tokens_per_episode": sum(float(r["tokens/sampled"]) for r in rows) / episodes,
        "groups_filtered": sum(float(r.get("groups/filtered", 0.0)) for r in rows),
    }


def measure(out: Path, plan: dict, attempts: int, skip_base: bool) -> dict[str, Any]:
    base = None if skip_base else stage(plan["base"])
    sft = stage(plan["sft"])
    sft_eval = stage(plan["sft_eval"])
    before = sft_eval["summary"]["pass@1"]
    runs = []
    for (seed, mode), command in plan["runs"].items():
        run = stage(command)
        run_dir = ROOT / run["summary"]["run_folder"]
        checkpoint = run_dir  # its latest checkpoint
        after = stage(evaluate(attempts, plan["model"], checkpoint=checkpoint))
        runs.append(
            {
                "seed": seed,
                "filter_groups": mode,
                "run_dir": str(run_dir),
                "wall_s": run["wall_s"],
                "peak_rss_gb": run["peak_rss_gb"],
                "eval_wall_s": after["wall_s"],
                "pass_at_1": after["summary"]["pass@1"],
                "gain": after["summary"]["pass@1"] - before,
                **rl_figures(run_dir),
            }
        )
    recipe_s = sft["wall_s"] + sft_eval["wall_s"] + runs[0]["wall_s"] + runs[0]["eval_wall_s"]
    stages = [s for s in (base, sft, sft_eval) if s is not None]
    peaks = [s["peak_rss_gb"] for s in stages if s["peak_rss_gb"] is not None]
    peaks += [r["peak_rss_gb"] for r in runs if r["peak_rss_gb"] is not None]
    return {
        "attempts": attempts,
        "base": None
        if base is None
        else {"pass_at_1": base["summary"]["pass@1"], "wall_s": base["wall_s"]},
        "sft": {"wall_s": sft["wall_s"], "peak_rss_gb": sft["peak_rss_gb"]},
        "sft_model": {"pass_at_1": before, "wall_s": sft_eval["wall_s"]},
        "runs": runs,
        "recipe_wall_s": recipe_s,
        "peak_rss_gb": max(peaks, default=None),
    }


def verdict(figures: dict[str, Any]) -> dict[str, bool]:
    runs = figures["runs"]
    recipe = [r for r in runs if r["filter_groups"] == runs[0]["filter_groups"]]
    peak = figures["peak_rss_gb"]
    return {
        "gain_met": recipe[0]["gain"] >= GAIN_GOAL
        and all(r["gain"] >= GAIN_GOAL_EVERY_SEED for r in recipe),
        "resets_met": all(r["resets"] == 0 for r in runs),
        "wall_met": figures["recipe_wall_s"] <= WALL_GOAL_S,
        "rss_met": peak is not None and peak <= RSS_GOAL_GB,
    }


def plot(figures: dict[str, Any], path: Path) -> None:
    """Reward per step of every RL run, and held-out pass@1 before and after each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rewards, passes) = plt.subplots(1, 2, figsize=(10, 4), width_ratios=(3, 2))
    before = figures["sft_model"]["pass_at_1"]
    for index, r in enumerate(figures["runs"]):
        label = f"seed {r['seed']}, filter_groups {r['filter_groups']}"
        steps = range(1, len(r["rewards"]) + 1)
        rewards.plot(steps, r["rewards"], marker="o", label=label)
        passes.plot([0, 1], [before, r["pass_at_1"]], marker="o", color=f"C{index}", label=label)
    rewards.set(xlabel="RL step", ylabel="mean reward of the step's episodes", ylim=(0, 1))
    rewards.set_title("training reward")
    rewards.legend(fontsize=8)
    passes.set(xticks=[0, 1], xticklabels=["before RL", "after RL"], ylim=(0, 1))
    passes.set(ylabel=f"held-out pass@1 ({figures['attempts']} attempts per task)")
    passes.set_title("held-out tasks")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(figures: dict[str, Any]) -> str:
    base = figures["base"]
    lines = [
        f"held-out pass@1 ({figures['attempts']} attempts per task): base"
        f" {'not run' if base is None else format(base['pass_at_1'], '.3f')}, after SFT"
        f" {figures['sft_model']['pass_at_1']:.3f}",
        f"SFT: {figures['sft']['wall_s']:.0f} s, evaluations"
        f" {'-' if base is None else format(base['wall_s'], '.0f')} s (base) and"
        f" {figures['sft_model']['wall_s']:.0f} s",
        "",
    ]
    headers = [
        "seed",
        "filter_groups",
        "pass@1 after RL",
        "gain",
        "wall s",
        "rollout s/step",
        "train s/step",
        "resets",
        "tokens/episode",
        "groups left out",
        "peak RSS GB",
    ]
    rows = [
        [
            str(r["seed"]),
            r["filter_groups"],
            f"{r['pass_at_1']:.3f}",
            f"{r['gain']:+.3f}",
            f"{r['wall_s']:.0f}",
            f"{r['rollout_s_per_step']:.1f}",
            f"{r['train_s_per_step']:.1f}",
            f"{r['resets']:.0f}",
            f"{r['tokens_per_episode']:.0f}",
            f"{r['groups_filtered']:.0f}",
            f"{r['peak_rss_gb']:.2f}",
        ]
        for r in figures["runs"]
    ]
    lines += right_aligned(headers, rows, left=2)
    lines.append("")
    for r in figures["runs"]:
        rewards = " ".join(f"{v:.2f}" for v in r["rewards"])
        lines.append(f"reward per step, seed {r['seed']} {r['filter_groups']}: {rewards}")
    goals = figures["verdict"]
    lines += [
        "",
        f"recipe wall (SFT, its eval, RL, eval): {figures['recipe_wall_s']:.0f} s"
        f"  (goal <= {WALL_GOAL_S} s: {'met' if goals['wall_met'] else 'MISSED'})",
        f"RL gain: goal >= {GAIN_GOAL} (first seed), >= {GAIN_GOAL_EVERY_SEED} (every seed):"
        f" {'met' if goals['gain_met'] else 'MISSED'}",
        f"resets: {'0 (met)' if goals['resets_met'] else 'MISSED'}",
        f"peak RSS {figures['peak_rss_gb']:.2f} GB (goal <= {RSS_GOAL_GB} GB:"
        f" {'met' if goals['rss_met'] else 'MISSED'})",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="run.seed of RL runs")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["zero-variance"],
        choices=["zero-variance", "none"],
        help="[algorithm].filter_groups of the RL runs: the first for every seed, the others"
        " for the first seed only",
    )
    parser.add_argument("--attempts", type=int, default=4, help="eval attempts per task")
    parser.add_argument("--output-dir", type=Path, default=None, help="where everything goes")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--skip-base", action="store_true", help="no eval of the base model")
    parser.add_argument("--plot", type=Path, help="write the reward curves and pass@1 as a PNG")
    args = parser.parse_args(argv)
    if args.output_dir is not None:
        out = args.output_dir.resolve()
    elif args.dry_run:
        out = Path(tempfile.gettempdir()) / "rllm-agent-quickstart"
    else:
        out = Path(tempfile.mkdtemp(prefix="rllm-agent-quickstart-"))
    plan = commands(out, args.seeds, args.modes, args.attempts)
    if args.dry_run:
        stages = [plan["sft"], plan["sft_eval"], *plan["runs"].values()]
        for line in stages if args.skip_base else [plan["base"], *stages]:
            print(shlex.join(line))
        return 0
    figures = measure(out, plan, args.attempts, args.skip_base)
    figures["verdict"] = verdict(figures)
    if args.plot is not None:
        plot(figures, args.plot)
    print(json.dumps(figures) if args.json else table(figures))
    return 0 if all(figures["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
