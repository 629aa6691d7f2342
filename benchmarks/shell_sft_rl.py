"""The shipped shell tasks: SFT on transcripts of the tasks' own solutions, then RL.

The 26 tasks of ``examples/tasks/shell`` are split, by a fixed seed, into train tasks and
held-out tasks, each split copied into a scratch folder (the harbor task source reads one
folder per split; nothing is written into the repository). Then, each step its own process
from the repository root:

1. transcripts: for every train task, the conversation the ``shell`` harness has with a model
   that issues the commands of the task's ``solution/solve.sh`` one per turn and then says the
   done marker. The harness itself plays it, in the local bubblewrap sandbox, against a scripted
   OpenAI-compatible endpoint that answers with those replies, so the prompts are the ones the
   harness renders and the observations are the commands' real output; the task's verifier must
   give the episode reward 1. The last request's messages and the final reply are one chat
   JSONL line (``messages``; the harness uses no tools);
2. ``rllm-core eval`` of the base model on ``examples/shell-agent/plan.toml`` (its ``[harness]``,
   ``[sampling]`` and sandbox) for the held-out tasks and the first ``--train-eval-limit`` train
   tasks;
3. ``rllm-core sft`` on the transcripts (torch backend, LoRA, SmolLM2-135M-Instruct), exported
   as a standalone model folder, and the same two evals of it;
4. ``rllm-core run`` of the shell-agent plan on the train tasks with ``[trainer].model`` = the
   exported folder for ``--rl-steps`` steps, and the same two evals of its final checkpoint.

pass@1 is the share of tasks whose attempts reach reward 1, averaged over attempts. It is a
figure, not a goal: the script exits 0 whatever the model scores. ``--transcripts-only`` stops
after step 1 (no model is loaded; seconds)::

    .venv/bin/python benchmarks/shell_sft_rl.py              # a table, 25 minutes on 2 busy cores
    .venv/bin/python benchmarks/shell_sft_rl.py --json       # one JSON object
    .venv/bin/python benchmarks/shell_sft_rl.py --transcripts-only --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rllm_core.run.checkpoints import checkpoint_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import right_aligned

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks" / "shell"
PLAN = ROOT / "examples" / "shell-agent" / "plan.toml"
MODEL = "smollm2-135m-instruct"


# ---------------------------------------------------------------- split


def split_tasks(held_out: int, seed: int) -> tuple[list[str], list[str]]:
    """Train and held-out task names: ``held_out`` of the sorted names drawn with ``seed``."""
    names = sorted(p.name for p in TASKS.iterdir() if (p / "task.toml").is_file())
    if not 0 < held_out < len(names):
        raise SystemExit(f"--held-out must be between 1 and {len(names) - 1}, got {held_out}")
    chosen = set(random.Random(seed).sample(names, held_out))
    return [n for n in names if n not in chosen], [n for n in names if n in chosen]


def copy_split(names: Sequence[str], target: Path) -> Path:
    target.mkdir(parents=True)
    for name in names:
        shutil.copytree(TASKS / name, target / name, symlinks=True)
    return target


# ---------------------------------------------------------------- transcripts


def solution_commands(script: str) -> list[str]:
    """The commands of a ``solve.sh``, one per complete shell command: comment lines, the
    shebang and ``set`` options dropped; lines joined until ``bash -n`` parses them (a loop
    spread over lines is one command)."""
    commands: list[str] = []
    pending: list[str] = []
    for line in script.splitlines():
        stripped = line.strip()
        if not pending and (
            not stripped or stripped.startswith("#") or stripped.startswith("set ")
        ):
            continue
        pending.append(line)
        text = "\n".join(pending)
        check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        if check.returncode == 0:
            commands.append(text.strip())
            pending = []
    if pending:
        raise ValueError(f"solve.sh ends inside a command: {chr(10).join(pending)!r}")
    return commands


class ScriptedModel:
    """An OpenAI-compatible chat endpoint that answers each request with the next scripted
    reply and keeps the messages of every request."""

    def __init__(self) -> None:
        self.replies: list[str] = []
        self.requests: list[list[dict[str, Any]]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                model.requests.append(body["messages"])
                content = model.replies.pop(0) if model.replies else ""
                answer = json.dumps(
                    {
                        "id": f"scripted-{len(model.requests)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": content},
                                "finish_reason": "stop",
                            }
                        ],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _transcripts(split_dir: Path) -> list[dict[str, Any]]:
    from rllm_core.plugins import PluginManager
    from rllm_core.types import LLMEndpoint

    plan = tomllib.loads(PLAN.read_text(encoding="utf-8"))
    manager = PluginManager()
    harness_keys = {k: v for k, v in plan["harness"].items() if k != "name"}
    harness = manager.get("harness", plan["harness"]["name"]).build(harness_keys)
    sandbox_keys = {k: v for k, v in plan["sandbox"].items() if k != "name"}
    backend = manager.get("sandbox_backend", plan["sandbox"]["name"]).build(sandbox_keys)
    source = manager.get("task_source", "harbor").build({"path": str(split_dir)})
    done = harness.config.done_marker
    model = ScriptedModel()
    endpoint = LLMEndpoint(base_url=model.base_url, api_key="scripted", model="solution")
    found = []
    try:
        for task in source.tasks():
            solve = Path(task.data["task_dir"]) / "solution" / "solve.sh"
            commands = solution_commands(solve.read_text(encoding="utf-8"))
            replies = [f"```bash\n{command}\n```" for command in commands] + [done]
            model.replies = list(replies)
            model.requests = []
            async with await backend.create(task.environment) as sandbox:
                await source.prepare(task, sandbox)
                outcome = await harness.run(task, endpoint, sandbox)
                grade = await source.grade(task, outcome, sandbox)
            messages = [*model.requests[-1], {"role": "assistant", "content": replies[-1]}]
            found.append(
                {
                    "task_id": task.task_id,
                    "commands": len(commands),
                    "turns": outcome.turns,
                    "termination": outcome.termination.value,
                    "reward": grade.reward,
                    "messages": messages,
                }
            )
    finally:
        model.close()
        await backend.close()
    return found


def build_transcripts(split_dir: Path, out: Path) -> list[dict[str, Any]]:
    """Play every task's solution through the harness; write the chat JSONL to ``out`` and
    return one record per task. Fails when a solution's episode does not earn reward 1."""
    found = asyncio.run(_transcripts(split_dir))
    bad = [
        f"{t['task_id']} ({t['termination']}, reward {t['reward']})"
        for t in found
        if t["reward"] < 1 or t["termination"] != "done"
    ]
    if bad:
        raise SystemExit("solution transcripts that do not solve their task: " + ", ".join(bad))
    with out.open("w", encoding="utf-8") as file:
        for t in found:
            file.write(json.dumps({"messages": t["messages"]}) + "\n")
    return found


# ---------------------------------------------------------------- stages


def _cli(*args: str) -> tuple[str, float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(
            f"rllm-core {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}"
            f"\n{result.stdout[-2000:]}"
        )
    return result.stdout, elapsed


def _only_folder(parent: Path, pattern: str = "*") -> Path:
    found = sorted(p for p in parent.glob(pattern) if p.is_dir())
    if len(found) != 1:
        raise SystemExit(f"expected one folder matching {parent / pattern}, found {found}")
    return found[0]


def evaluate(label: str, splits: list[str], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """pass@1 of the plan's model, with ``--set`` ``splits`` and an optional checkpoint, on
    the held-out (``eval``) and the ``train`` split."""
    figures: dict[str, Any] = {}
    for split in ("eval", "train"):
        target = out / f"eval-{label}-{split}"
        limit = args.train_eval_limit if split == "train" and args.train_eval_limit else None
        _, wall = _cli(
            "eval",
            str(PLAN),
            "--plain",
            *(("--limit", str(limit)) if limit else ()),
            "--split",
            split,
            "--attempts",
            str(args.attempts),
            "--temperature",
            repr(args.temperature),
            "--set",
            f"run.output_dir={target}",
            *splits,
        )
        summary = json.loads((_only_folder(target) / "summary.json").read_text())
        figures["held_out" if split == "eval" else "train"] = {
            "pass@1": summary["pass@1"],
            "mean_reward": summary["mean_reward"],
            "tasks": summary["tasks"],
            "infra_failures": summary["infra_failures"],
            "wall_s": wall,
        }
    return figures


def sft(data: Path, out: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    export = out / "sft-model"
    plan = out / "sft.toml"
    plan.write_text(
        f"""[run]
name = "shell-sft"
seed = {args.seed}
output_dir = {json.dumps(str(out / "runs-sft"))}

[sft]
data = {json.dumps(str(data))}
epochs = {args.sft_epochs}
batch_size = {args.sft_batch_size}
export = {json.dumps(str(export))}

[trainer]
name = "torch"
model = "{MODEL}"
device = "cpu"
learning_rate = {args.sft_lr!r}
lora = {{ rank = 16, alpha = 32.0 }}
micro_batch_size = {args.sft_batch_size}

[renderer]
name = "chatml"
""",
        encoding="utf-8",
    )
    _, wall = _cli("sft", str(plan), "--quiet")
    run_dir = _only_folder(out / "runs-sft")
    summary = json.loads((run_dir / "summary.json").read_text())
    return export, {"wall_s": wall, "run_dir": str(run_dir), "summary": summary}


def rl(model: Path, splits: list[str], out: Path, args: argparse.Namespace) -> tuple[Path, dict]:
    runs = out / "runs-rl"
    _, wall = _cli(
        "run",
        str(PLAN),
        "--plain",
        "--quiet",
        "--set",
        f"run.output_dir={runs}",
        "--set",
        f"run.steps={args.rl_steps}",
        "--set",
        f"run.save_every={args.rl_steps}",
        "--set",
        f"trainer.model={model}",
        *splits,
    )
    run_dir = _only_folder(runs)
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = checkpoint_folder(run_dir)
    return final, {
        "wall_s": wall,
        "run_dir": str(run_dir),
        "checkpoint": str(final),
        "rewards": [row.get("reward/mean") for row in metrics],
        "infra_failures": summary.get("infra_failures"),
    }


# ---------------------------------------------------------------- report


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def table(figures: dict[str, Any]) -> str:
    lines = [
        f"train tasks ({len(figures['train_tasks'])}): {', '.join(figures['train_tasks'])}",
        f"held-out tasks ({len(figures['held_out_tasks'])}):"
        f" {', '.join(figures['held_out_tasks'])}",
        f"transcripts: {len(figures['transcripts'])}, every one reward 1 through the harness",
    ]
    stages = figures.get("stages")
    if stages:
        rows = [
            [
                name,
                _rate(stage["held_out"]["pass@1"]),
                _rate(stage["train"]["pass@1"]),
                f"{stage.get('wall_s', 0.0):.0f}",
            ]
            for name, stage in stages.items()
        ]
        lines += [
            "",
            *right_aligned(["model", "held-out pass@1", "train pass@1", "stage s"], rows, left=1),
        ]
        lines += [
            "",
            f"eval: {figures['attempts']} attempt(s) a task, temperature {figures['temperature']}",
            f"RL mean reward by step: {figures['rl']['rewards']}",
            f"total wall time: {figures['wall_s']:.0f} s",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and the SFT run")
    parser.add_argument("--held-out", type=int, default=6, help="tasks held out of training")
    parser.add_argument("--sft-epochs", type=int, default=2, help="SFT passes over the transcripts")
    parser.add_argument("--sft-batch-size", type=int, default=4, help="transcripts per SFT step")
    parser.add_argument("--sft-lr", type=float, default=1e-3, help="SFT learning rate")
    parser.add_argument("--rl-steps", type=int, default=2, help="RL steps from the SFT model")
    parser.add_argument("--attempts", type=int, default=1, help="eval attempts a task")
    parser.add_argument(
        "--train-eval-limit",
        type=int,
        default=6,
        help="evaluate only the first N train tasks (0: all of them)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="eval sampling temperature (0: greedy)"
    )
    parser.add_argument(
        "--transcripts-only",
        action="store_true",
        help="build and check the SFT transcripts, then stop (no model is loaded)",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="keep the splits, runs and evals here"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    train, held_out = split_tasks(args.held_out, args.seed)
    figures: dict[str, Any] = {
        "plan": str(PLAN.relative_to(ROOT)),
        "seed": args.seed,
        "train_tasks": train,
        "held_out_tasks": held_out,
    }
    with tempfile.TemporaryDirectory(prefix="rllm-shell-sft-rl-") as scratch:
        out = (args.output_dir or Path(scratch)).resolve()
        out.mkdir(parents=True, exist_ok=True)
        train_dir = copy_split(train, out / "tasks" / "train")
        held_out_dir = copy_split(held_out, out / "tasks" / "held-out")
        data = out / "sft.jsonl"
        found = build_transcripts(train_dir, data)
        figures["transcripts"] = [
            {k: t[k] for k in ("task_id", "commands", "turns", "reward")} for t in found
        ]
        if not args.transcripts_only:
            splits = [
                "--set",
                f"tasks.path={train_dir}",
                "--set",
                f"tasks.eval_path={held_out_dir}",
            ]
            figures["attempts"] = args.attempts
            figures["temperature"] = args.temperature
            stages: dict[str, Any] = {}
            began = time.monotonic()
            stages["base"] = evaluate("base", splits, out, args)
            stages["base"]["wall_s"] = time.monotonic() - began
            began = time.monotonic()
            model, figures["sft"] = sft(data, out, args)
            model_set = ["--set", f"trainer.model={model}"]
            stages["sft"] = evaluate("sft", [*splits, *model_set], out, args)
            stages["sft"]["wall_s"] = time.monotonic() - began
            began = time.monotonic()
            checkpoint, figures["rl"] = rl(model, splits, out, args)
            stages["sft+rl"] = evaluate(
                "rl", [*splits, *model_set, "--checkpoint", str(checkpoint)], out, args
            )
            stages["sft+rl"]["wall_s"] = time.monotonic() - began
            figures["stages"] = stages
    figures["wall_s"] = time.monotonic() - started
    print(json.dumps(figures) if args.json else table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
