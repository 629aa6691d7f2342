"""Where a training step's memory goes on multi-turn agent episodes, setting by setting.

One ``forward_backward`` + ``optim_step`` of the torch backend (SmolLM2-135M-Instruct, float32,
LoRA rank 16, DPPO-TV) over a batch shaped like the mini-swe-agent example's episodes:
``--episodes`` sequences, each a ``--prompt``-token prompt then ``--turns`` turns of a
``--action``-token reply and an ``--observation``-token tool result (random token ids from a
seeded generator, advantages +-1). Each setting runs in a fresh process, so its peak RSS is
its own; reported per setting: RSS with the model loaded, peak RSS during the step, the
step's extra memory (peak minus loaded) and its wall seconds.

Settings, each adding one change to the one before:

1. ``as shipped before``: 4 episodes per forward pass, activations kept for the backward pass,
   logits at every action and observation position;
2. ``+ checkpointing, 4096 tokens``: activations recomputed, at most 4096 tokens a pass;
3. ``+ action positions only``: the output layer at action positions only (the policy loss
   reads no observation logprobs);
4. ``+ 2048 tokens``: at most 2048 tokens a pass;
5. ``no checkpointing, 1024 tokens``: activations kept again, at most 1024 tokens a pass
   (faster, as nothing is recomputed).

Run from the repository root after ``scripts/setup.sh``::

    .venv/bin/python benchmarks/agent_train_memory.py          # a table
    .venv/bin/python benchmarks/agent_train_memory.py --json   # one JSON object
    .venv/bin/python benchmarks/agent_train_memory.py --quick  # 2 short episodes, a fast check

Goal (exit 1 when missed): the peak RSS of the 4th setting (the mini-swe-agent example's
training settings) <= 4 GB.
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

RSS_GOAL_GB = 4.0
GOAL_SETTING = 3
SETTINGS: list[tuple[str, dict[str, Any], bool]] = [
    ("as shipped before", {"micro_batch_size": 4}, True),
    (
        "+ checkpointing, 4096 tokens",
        {"micro_batch_size": 4, "micro_batch_tokens": 4096, "gradient_checkpointing": True},
        True,
    ),
    (
        "+ action positions only",
        {"micro_batch_size": 4, "micro_batch_tokens": 4096, "gradient_checkpointing": True},
        False,
    ),
    (
        "+ 2048 tokens",
        {"micro_batch_size": 4, "micro_batch_tokens": 2048, "gradient_checkpointing": True},
        False,
    ),
    (
        "no checkpointing, 1024 tokens",
        {"micro_batch_size": 4, "micro_batch_tokens": 1024},
        False,
    ),
]


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def episodes(args: argparse.Namespace, vocab: int) -> list[Any]:
    from rllm_core.types import Datum

    rng = random.Random(0)
    made = []
    for index in range(args.episodes):
        tokens, action, observation = [], [], []
        pieces = [(args.prompt, "prompt")]
        pieces += [(args.action, "action"), (args.observation, "observation")] * args.turns
        for length, kind in pieces:
            tokens += [rng.randrange(vocab) for _ in range(length)]
            action += [kind == "action"] * length
            observation += [kind == "observation"] * length
        made.append(
            Datum(
                token_ids=tokens,
                logprobs=[-rng.uniform(0.1, 3.0) if a else 0.0 for a in action],
                advantages=[1.0 if index % 2 == 0 else -1.0] * len(tokens),
                action_mask=action,
                observation_mask=observation,
            )
        )
    return made


def one(args: argparse.Namespace) -> dict[str, Any]:
    """Run setting ``args.setting`` in this process."""
    import torch
    from rllm_core.algorithms.objective import Objective
    from rllm_loss_dppo.loss import DPPOTV
    from rllm_loss_dppo.plugin import DPPOTVConfig
    from rllm_trainer_backend_torch.backend import TorchBackend
    from rllm_trainer_backend_torch.plugin import TorchBackendConfig

    name, overrides, observations = SETTINGS[args.setting]

    class ReadsObservations(DPPOTV):
        reads_observations = True

    loss = (ReadsObservations if observations else DPPOTV)(DPPOTVConfig())
    torch.set_num_threads(args.threads)
    backend = TorchBackend(
        TorchBackendConfig(model=args.model, device="cpu", lora={"rank": 16}, **overrides)
    )
    batch = episodes(args, backend.model.get_input_embeddings().weight.shape[0])
    loaded = peak_rss_gb()
    started = time.perf_counter()
    backend.forward_backward(batch, Objective.of(loss))
    backend.optim_step()
    seconds = time.perf_counter() - started
    peak = peak_rss_gb()
    backend.close()
    return {
        "setting": name,
        "loaded_rss_gb": loaded,
        "peak_rss_gb": peak,
        "step_extra_gb": peak - loaded,
        "step_s": seconds,
    }


def run_setting(index: int, name: str, forwarded: list[str]) -> dict[str, Any]:
    """Setting ``index`` in a fresh process; a process the kernel kills for memory is reported
    with the RSS it had reached."""
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(
            [sys.executable, __file__, *forwarded, "--setting", str(index)],
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(process.pid, 0)
        out.seek(0)
        lines = out.read().strip().splitlines()
    if os.waitstatus_to_exitcode(status) == 0 and lines:
        return json.loads(lines[-1])
    return {
        "setting": name,
        "failed": f"exit status {os.waitstatus_to_exitcode(status)} (-9: killed, out of memory)",
        "peak_rss_gb": usage.ru_maxrss / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=1200)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--action", type=int, default=100)
    parser.add_argument("--observation", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 episodes of 2 short turns")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--only", type=int, nargs="+", help="run these settings (1-based) and no others"
    )
    parser.add_argument("--setting", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.prompt, args.turns, args.action, args.observation = 2, 64, 2, 16, 16
    if args.setting is not None:
        print(json.dumps(one(args)))
        return 0

    results = []
    given = list(argv if argv is not None else sys.argv[1:])
    if "--only" in given:
        start = given.index("--only")
        end = start + 1
        while end < len(given) and given[end].isdigit():
            end += 1
        del given[start:end]
    forwarded = [a for a in given if a != "--json"]
    for index, (name, _, _) in enumerate(SETTINGS):
        if args.only and index + 1 not in args.only:
            results.append({"setting": name, "failed": "not run (--only)", "peak_rss_gb": 0.0})
            continue
        if not args.json:
            print(f"running: {name}", file=sys.stderr)
        results.append(run_setting(index, name, forwarded))
    tokens = args.prompt + args.turns * (args.action + args.observation)
    report = {
        "episodes": args.episodes,
        "tokens_per_episode": tokens,
        "threads": args.threads,
        "settings": results,
        "goal_peak_rss_gb": RSS_GOAL_GB,
        "goal_met": "failed" not in results[GOAL_SETTING]
        and results[GOAL_SETTING]["peak_rss_gb"] <= RSS_GOAL_GB,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{args.episodes} episodes of {tokens} tokens ({args.prompt} prompt, {args.turns}"
            f" turns of {args.action} action + {args.observation} observation), {args.threads}"
            " threads"
        )
        rows = []
        for r in results:
            if "failed" in r:
                row = [r["setting"], "", f"{r['peak_rss_gb']:.2f}", "", r["failed"]]
            else:
                row = [r["setting"], f"{r['loaded_rss_gb']:.2f}", f"{r['peak_rss_gb']:.2f}"]
                row += [f"{r['step_extra_gb']:.2f}", f"{r['step_s']:.1f}"]
            rows.append(row)
        headers = ["setting", "loaded GB", "peak GB", "step extra GB", "step s"]
        for line in right_aligned(headers, rows, left=1):
            print(line)
        name = SETTINGS[GOAL_SETTING][0]
        print(f"goal: peak RSS of {name!r} <= {RSS_GOAL_GB} GB: {report['goal_met']}")
    return 0 if report["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
