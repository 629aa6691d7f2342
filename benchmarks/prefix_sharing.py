"""Training on agent calls that share prefixes: right-padded rows against a prefix tree.

One ``forward_backward`` + ``optim_step`` of the torch backend (SmolLM2-135M-Instruct, float32,
LoRA rank 16, DPPO-TV) over datums shaped like a step of the mini-swe-agent example: ``--groups``
groups of ``--group-size`` episodes, each episode ``--calls`` model calls. Every call of a group
starts with the group's ``--prompt``-token task messages; call ``k`` then holds ``k`` format-error
messages of ``--feedback`` tokens (the agent drops a reply it cannot parse, so its history is
rewound) and a ``--reply``-token reply, the only action tokens. Random token ids from a seeded
generator, advantages +-1. Each setting runs in a fresh process, so its peak RSS is its own;
reported per setting: tokens trained, tokens through the model (distinct prefixes when shared),
forward passes, wall seconds and peak RSS.

Settings:

1. ``right-padded``: 4 rows a pass, at most 4096 tokens, activations recomputed (the
   example's settings before prefix sharing);
2. ``shared prefixes``: the example's settings: ``share_prefixes``, 16 rows and at most 4096
   distinct tokens a pass, activations recomputed;
3. ``shared, no recompute``: the same with activations kept;
4. ``shared, mmap 1 MiB``: setting 2 with ``malloc_mmap_threshold_kb = 1024``, as the example
   ships (freed memory goes back to the system).

Run from the repository root after ``scripts/setup.sh``::

    .venv/bin/python benchmarks/prefix_sharing.py          # a table
    .venv/bin/python benchmarks/prefix_sharing.py --json   # one JSON object
    .venv/bin/python benchmarks/prefix_sharing.py --quick  # a small batch, a fast check

Goal (exit 1 when missed): the shared setting takes at most half the right-padded one's time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from _tables import right_aligned

SPEEDUP_GOAL = 2.0
SETTINGS: list[tuple[str, dict[str, Any]]] = [
    (
        "right-padded",
        {"micro_batch_size": 4, "micro_batch_tokens": 4096, "gradient_checkpointing": True},
    ),
    (
        "shared prefixes",
        {
            "micro_batch_size": 16,
            "micro_batch_tokens": 4096,
            "gradient_checkpointing": True,
            "share_prefixes": True,
        },
    ),
    (
        "shared, no recompute",
        {"micro_batch_size": 16, "micro_batch_tokens": 4096, "share_prefixes": True},
    ),
    (
        "shared, mmap 1 MiB",
        {
            "micro_batch_size": 16,
            "micro_batch_tokens": 4096,
            "gradient_checkpointing": True,
            "share_prefixes": True,
            "malloc_mmap_threshold_kb": 1024,
        },
    ),
]


def calls(args: argparse.Namespace, vocab: int) -> list[Any]:
    """The step's datums, one per model call."""
    from rllm_core.types import Datum

    rng = random.Random(0)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(count)]

    made = []
    for _ in range(args.groups):
        prompt = tokens(args.prompt)
        for episode in range(args.group_size):
            history = list(prompt)
            for _ in range(args.calls):
                reply = tokens(args.reply)
                ids = history + reply
                action = [i >= len(history) for i in range(len(ids))]
                made.append(
                    Datum(
                        token_ids=ids,
                        logprobs=[-rng.uniform(0.1, 3.0) if a else 0.0 for a in action],
                        advantages=[1.0 if episode % 2 == 0 else -1.0] * len(ids),
                        action_mask=action,
                        observation_mask=[False] * len(ids),
                    )
                )
                history += tokens(args.feedback)
    return made


def one(args: argparse.Namespace) -> dict[str, Any]:
    """Run setting ``args.setting`` in this process."""
    import torch
    from rllm_core.algorithms.objective import Objective
    from rllm_loss_dppo.loss import DPPOTV
    from rllm_loss_dppo.plugin import DPPOTVConfig
    from rllm_trainer_backend_torch.backend import TorchBackend
    from rllm_trainer_backend_torch.collate import collate
    from rllm_trainer_backend_torch.plugin import TorchBackendConfig
    from rllm_trainer_backend_torch.prefix_tree import PrefixTree

    name, overrides = SETTINGS[args.setting]
    torch.set_num_threads(args.threads)
    backend = TorchBackend(
        TorchBackendConfig(model=args.model, device="cpu", lora={"rank": 16}, **overrides)
    )
    datums = calls(args, backend.model.get_input_embeddings().weight.shape[0])
    batch = collate(datums, vocab_size=10**9, max_length=None)
    micros = list(backend._micro_batches(batch))
    shared = overrides.get("share_prefixes", False)
    through = sum(
        PrefixTree.of(m.token_ids, m.lengths).size if shared else m.token_ids.numel()
        for m in micros
    )
    started = time.perf_counter()
    backend.forward_backward(datums, Objective.of(DPPOTV(DPPOTVConfig())))
    backend.optim_step()
    seconds = time.perf_counter() - started
    backend.close()
    return {
        "setting": name,
        "tokens": int(batch.lengths.sum()),
        "model_tokens": through,
        "passes": len(micros),
        "step_s": seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def run_setting(index: int, forwarded: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.run(
            [sys.executable, __file__, *forwarded, "--setting", str(index)],
            stdout=out,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        out.seek(0)
        lines = out.read().strip().splitlines()
    if process.returncode != 0 or not lines:
        return {"setting": SETTINGS[index][0], "failed": f"exit status {process.returncode}"}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--feedback", type=int, default=30)
    parser.add_argument("--reply", type=int, default=110)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="a small batch of short calls")
    parser.add_argument("--dry-run", action="store_true", help="print the settings and stop")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--setting", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.group_size, args.calls = 1, 2, 2
        args.prompt, args.feedback, args.reply = 64, 8, 16
    if args.setting is not None:
        print(json.dumps(one(args)))
        return 0
    if args.dry_run:
        for name, overrides in SETTINGS:
            print(f"{name}: {json.dumps(overrides, sort_keys=True)}")
        return 0

    given = list(argv if argv is not None else sys.argv[1:])
    forwarded = [a for a in given if a != "--json"]
    results = []
    for index, (name, _) in enumerate(SETTINGS):
        if not args.json:
            print(f"running: {name}", file=sys.stderr)
        results.append(run_setting(index, forwarded))
    padded, shared = results[0], results[1]
    speedup = None
    if "failed" not in padded and "failed" not in shared:
        speedup = padded["step_s"] / shared["step_s"]
    report = {
        "shape": {
            "groups": args.groups,
            "group_size": args.group_size,
            "calls": args.calls,
            "prompt": args.prompt,
            "feedback": args.feedback,
            "reply": args.reply,
            "threads": args.threads,
        },
        "settings": results,
        "speedup": speedup,
        "goal_speedup": SPEEDUP_GOAL,
        "goal_met": speedup is not None and speedup >= SPEEDUP_GOAL,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{args.groups} groups x {args.group_size} episodes x {args.calls} calls: a"
            f" {args.prompt}-token prompt, {args.feedback}-token feedback per earlier call, a"
            f" {args.reply}-token reply; {args.threads} threads"
        )
        rows = []
        for r in results:
            if "failed" in r:
                rows.append([r["setting"], "", "", "", "", r["failed"]])
                continue
            rows.append(
                [
                    r["setting"],
                    str(r["tokens"]),
                    str(r["model_tokens"]),
                    str(r["passes"]),
                    f"{r['step_s']:.1f}",
                    f"{r['peak_rss_gb']:.2f}",
                ]
            )
        headers = ["setting", "tokens", "through model", "passes", "step s", "peak GB"]
        for line in right_aligned(headers, rows, left=1):
            print(line)
        shown = "n/a" if speedup is None else f"{speedup:.2f}x"
        print(f"goal: shared prefixes >= {SPEEDUP_GOAL}x faster than right-padded: {shown}")
    return 0 if report["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
