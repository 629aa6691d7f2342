"""Sampling throughput: the torch backend's sampler against ``model.generate``.

SmolLM2-135M-Instruct in float32 on the CPU. For each batch size (1, 8 and 32 concurrent
requests) every path gets the same prompts and settings: 128 new tokens forced (no stop ids,
no end-of-sequence), temperature 1.0, top-p 1.0, no top-k. Prompts are stretches of 40 to 200
tokens of the Python standard library's source, tokenized with the model's tokenizer, lengths
and offsets drawn from a fixed seed.

Paths, all in one process, one after the other:

- ``sampler``: :class:`rllm_trainer_backend_torch.sampler.TorchSampler`, all requests submitted at
  once through ``sample_many`` (admitted together, decoded as one batch).
- ``generate (batched)``: one ``model.generate`` call on the whole batch, left-padded with an
  attention mask: the best ``generate`` can do with requests that are all known up front.
- ``generate (one at a time)``: ``model.generate`` on each request alone, one after another:
  what serving each rollout's request as it arrives with ``generate`` does. Each request takes
  the same time whatever the batch size, so only the first ``--sequential-requests`` of a batch
  are run and their rate stands for the batch (the table says how many).

Throughput is new tokens per second of wall time, prompt processing included. Each path runs
once untimed on a short request first, so one-time costs are not counted.

The goal (3x at batch 8 and 32) is judged against ``generate (batched)``: the issue asks for
the sampler against ``model.generate`` on the same model, prompts and settings, and the batched
call is the same prompts given to ``generate`` at once. The speed-up against one-at-a-time
``generate`` is reported next to it.

Run from the repository root (needs rllm-trainer-backend-torch and the SmolLM2 model, pulled
into the cache on first use)::

    .venv/bin/python benchmarks/sampling_throughput.py            # a table, a few minutes
    .venv/bin/python benchmarks/sampling_throughput.py --json     # one JSON object
    .venv/bin/python benchmarks/sampling_throughput.py --quick    # batch 1 and 8, 32 tokens

Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from _tables import right_aligned
from rllm_core.models import resolve_model
from rllm_core.types import SampleRequest, SamplingParams
from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.sampler import TorchSampler
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

MODEL = "smollm2-135m-instruct"
BATCHES = (1, 8, 32)
NEW_TOKENS = 128
PROMPT_TOKENS = (40, 200)
GOAL_BATCHES = (8, 32)
GOAL_SPEEDUP = 3.0


# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------


def make_prompts(tokenizer: Any, count: int, seed: int) -> list[list[int]]:
    """``count`` prompts of 40-200 tokens cut from standard-library source at seeded offsets."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    stream: list[int] = []
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        stream.extend(tokenizer.encode(text, add_special_tokens=False))
        if len(stream) >= 50 * PROMPT_TOKENS[1] * max(count, 1):
            break
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        length = rng.randint(*PROMPT_TOKENS)
        start = rng.randrange(len(stream) - length)
        prompts.append(stream[start : start + length])
    return prompts


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


def run_sampler(sampler: TorchSampler, prompts: list[list[int]], new_tokens: int) -> float:
    requests = [
        SampleRequest(
            prompt_token_ids=prompt,
            params=SamplingParams(max_tokens=new_tokens, temperature=1.0, top_p=1.0, seed=i),
        )
        for i, prompt in enumerate(prompts)
    ]
    start = time.perf_counter()
    results = sampler.sample_many(requests)
    elapsed = time.perf_counter() - start
    lengths = {len(r.completion_token_ids) for r in results}
    if lengths != {new_tokens}:
        raise AssertionError(f"the sampler produced completions of {lengths} tokens")
    return elapsed


def generation_config(new_tokens: int, pad_id: int) -> GenerationConfig:
    return GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=pad_id,
    )


def run_generate(
    model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, pad_id: int
) -> float:
    """One ``generate`` call over ``prompts``, left-padded; seconds."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    config = generation_config(new_tokens, pad_id)
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(ids, attention_mask=mask, generation_config=config)
    elapsed = time.perf_counter() - start
    if output.shape[1] != width + new_tokens:
        raise AssertionError(f"generate produced {output.shape[1] - width} new tokens")
    return elapsed


def measure(
    model: torch.nn.Module,
    sampler: TorchSampler,
    prompts: list[list[int]],
    new_tokens: int,
    sequential_requests: int,
    pad_id: int,
) -> dict[str, Any]:
    batch = len(prompts)
    tokens = batch * new_tokens
    sampler_s = run_sampler(sampler, prompts, new_tokens)
    batched_s = run_generate(model, prompts, new_tokens, pad_id)
    if batch == 1:
        sequential_count, sequential_s = 1, batched_s
    else:
        sequential_count = min(batch, sequential_requests)
        sequential_s = sum(
            run_generate(model, [prompt], new_tokens, pad_id)
            for prompt in prompts[:sequential_count]
        )
    row = {
        "batch": batch,
        "new_tokens": new_tokens,
        "prompt_tokens": sum(map(len, prompts)),
        "sampler_s": sampler_s,
        "sampler_tokens_per_s": tokens / sampler_s,
        "generate_batched_s": batched_s,
        "generate_batched_tokens_per_s": tokens / batched_s,
        "generate_sequential_requests_run": sequential_count,
        "generate_sequential_s": sequential_s,
        "generate_sequential_tokens_per_s": sequential_count * new_tokens / sequential_s,
    }
    row["speedup_vs_batched"] = row["sampler_tokens_per_s"] / row["generate_batched_tokens_per_s"]
    row["speedup_vs_sequential"] = (
        row["sampler_tokens_per_s"] / row["generate_sequential_tokens_per_s"]
    )
    return row


def run(
    batches: Sequence[int],
    new_tokens: int,
    sequential_requests: int,
    seed: int,
    threads: int | None,
) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    folder = resolve_model(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = make_prompts(tokenizer, max(batches), seed)
    sampler = TorchSampler(model, gate=WeightGate(), max_batch_size=max(batches))
    try:
        run_sampler(sampler, prompts[:2], 4)
        run_generate(model, prompts[:2], 4, pad_id)
        rows = [
            measure(model, sampler, prompts[:batch], new_tokens, sequential_requests, pad_id)
            for batch in batches
        ]
    finally:
        sampler.close()
    results: dict[str, Any] = {"rows": rows}
    results["goals"] = evaluate(rows)
    results["setup"] = {
        "model": MODEL,
        "model_dir": str(folder),
        "dtype": "float32",
        "device": "cpu",
        "batches": list(batches),
        "new_tokens": new_tokens,
        "prompt_tokens_range": list(PROMPT_TOKENS),
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": seed,
        "sequential_requests": sequential_requests,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": model.config._attn_implementation,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_average": list(os.getloadavg()),
    }
    return results


def evaluate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The speed-up goal at each goal batch size present, against batched ``generate``."""
    verdicts = []
    for row in rows:
        if row["batch"] in GOAL_BATCHES:
            verdicts.append(
                {
                    "goal": "sampler_over_generate_batched",
                    "batch": row["batch"],
                    "value": row["speedup_vs_batched"],
                    "target": f">= {GOAL_SPEEDUP:g}",
                    "passed": row["speedup_vs_batched"] >= GOAL_SPEEDUP,
                }
            )
    return verdicts


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    setup = results["setup"]
    lines = [
        f"Sampling throughput: {setup['model']} ({setup['dtype']}, {setup['device']},"
        f" {setup['torch_threads']} torch threads), {setup['new_tokens']} new tokens per request,"
        f" prompts of {setup['prompt_tokens_range'][0]}-{setup['prompt_tokens_range'][1]}"
        f" tokens, temperature {setup['temperature']:g}, top-p {setup['top_p']:g}",
        "",
        "New tokens per second (wall time, prompt processing included)",
    ]
    lines.extend(
        right_aligned(
            [
                "batch",
                "prompt tok",
                "sampler",
                "generate batched",
                "generate 1-at-a-time",
                "(requests run)",
                "x batched",
                "x 1-at-a-time",
            ],
            [
                [
                    str(r["batch"]),
                    str(r["prompt_tokens"]),
                    f"{r['sampler_tokens_per_s']:.1f}",
                    f"{r['generate_batched_tokens_per_s']:.1f}",
                    f"{r['generate_sequential_tokens_per_s']:.1f}",
                    str(r["generate_sequential_requests_run"]),
                    f"{r['speedup_vs_batched']:.2f}x",
                    f"{r['speedup_vs_sequential']:.2f}x",
                ]
                for r in results["rows"]
            ],
        )
    )
    lines.append("")
    lines.append("Goals (judged against generate batched: the same prompts given to it at once)")
    if results["goals"]:
        lines.extend(
            right_aligned(
                ["goal", "batch", "measured", "target", "result"],
                [
                    [
                        g["goal"],
                        str(g["batch"]),
                        f"{g['value']:.2f}",
                        g["target"],
                        "pass" if g["passed"] else "FAIL",
                    ]
                    for g in results["goals"]
                ],
            )
        )
    else:
        lines.append("(no goal batch size in this run)")
    load = ", ".join(f"{x:.2f}" for x in setup["load_average"])
    lines.append("")
    lines.append(
        f"torch {setup['torch']}, transformers {setup['transformers']},"
        f" attention {setup['attn_implementation']}, {setup['cpu_count']} CPUs,"
        f" load average at the end {load}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--quick", action="store_true", help="batch 1 and 8, 32 new tokens, 2 sequential requests"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sequential-requests",
        type=int,
        default=4,
        help="requests of each batch run through one-at-a-time generate (default 4)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    args = parser.parse_args(argv)
    batches, new_tokens, sequential = BATCHES, NEW_TOKENS, args.sequential_requests
    if args.quick:
        batches, new_tokens, sequential = (1, 8), 32, min(sequential, 2)
    results = run(batches, new_tokens, sequential, args.seed, args.threads)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0 if all(goal["passed"] for goal in results["goals"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
