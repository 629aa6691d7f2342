"""Training throughput: the torch backend's forward_backward + optim_step against a plain loop.

Both train SmolLM2-135M-Instruct (float32) on the same batch: ``--batch`` sequences of
``--seq-len`` tokens (default 2 x 512; random token ids from a seeded generator, the first 64
tokens a prompt, the rest action tokens with one advantage of +-1 per sequence), in two modes:

- ``lora``: peft adapters of rank 16, alpha 32 on every attention and MLP projection (the
  backend's defaults);
- ``full``: every parameter.

The backend step is ``backend.forward_backward(datums, Objective.of(reinforce))`` followed by
``backend.optim_step()``, timed from the ``Datum`` records (collation included). The plain loop
is what one would write by hand on the same model, with the batch already in tensors: a
forward pass, ``log_softmax`` and ``gather`` of the token logprobs, the policy-gradient loss
``-sum(A * logprob * mask) / sum(mask)``, ``backward``, ``clip_grad_norm_(1.0)``, an AdamW step
and ``zero_grad``. Its model is loaded separately, wrapped with the same peft config, and starts
from the backend's initial trainable weights, so both compute the same first loss (reported).

The two alternate step by step in one process (the order flips every repeat, so drift on a
shared machine hits both alike) after one untimed warm-up step each; the figure is the median
of ``--repeats`` timed steps. tokens/s counts every token of the batch.

Goal: the backend within 10% of the plain loop in both modes (throughput ratio >= 0.90).

Run from the repository root after ``scripts/setup.sh`` (needs rllm-trainer-backend-torch and
rllm-loss-ppo)::

    .venv/bin/python benchmarks/training_throughput.py            # a table
    .venv/bin/python benchmarks/training_throughput.py --json     # one JSON object
    .venv/bin/python benchmarks/training_throughput.py --quick    # 2 x 64 tokens, a fast check

``--model`` takes a catalog name or a local model folder; ``--device`` picks the device
(default: CUDA when present). Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.models import resolve_model
from rllm_core.types import Datum
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.plugin import TorchBackendConfig

PROMPT_TOKENS = 64
LEARNING_RATE = 1e-5
MAX_GRAD_NORM = 1.0
GOAL_RATIO = 0.90
"""Backend tokens/s over plain-loop tokens/s, at least."""


# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------


def make_datums(batch: int, seq_len: int, vocab: int, seed: int) -> list[Datum]:
    rng = random.Random(seed)
    prompt = min(PROMPT_TOKENS, seq_len // 2)
    datums = []
    for index in range(batch):
        advantage = 1.0 if index % 2 == 0 else -1.0
        datums.append(
            Datum(
                token_ids=[rng.randrange(vocab) for _ in range(seq_len)],
                logprobs=[0.0] * prompt + [-rng.uniform(0.1, 5.0) for _ in range(seq_len - prompt)],
                advantages=[advantage] * seq_len,
                action_mask=[False] * prompt + [True] * (seq_len - prompt),
                observation_mask=[False] * seq_len,
            )
        )
    return datums


class PlainLoop:
    """The hand-written baseline: one model, one AdamW, one batch already in tensors."""

    def __init__(self, backend: TorchBackend, model_dir: str, datums: list[Datum]) -> None:
        from transformers import AutoModelForCausalLM

        config = backend.config
        device = backend.device
        model = AutoModelForCausalLM.from_pretrained(model_dir).to(device=device)
        if config.lora.full:
            model.requires_grad_(True)
        else:
            from peft import LoraConfig, get_peft_model

            lora = config.lora
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.rank,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=list(lora.target_modules),
                    bias="none",
                    task_type="CAUSAL_LM",
                ),
            )
        trainable = dict(backend.trainable_parameters)
        own = {name: p for name, p in model.named_parameters() if p.requires_grad}
        if own.keys() != trainable.keys():
            raise SystemExit("the plain model's trainable parameters differ from the backend's")
        with torch.no_grad():
            for name, param in own.items():
                param.copy_(trainable[name])
        self.model = model
        self.params = list(own.values())
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=config.learning_rate,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
        self.input_ids = torch.tensor([d.token_ids for d in datums], device=device)
        self.mask = torch.tensor([d.action_mask for d in datums], device=device).float()[:, 1:]
        self.advantages = torch.tensor([d.advantages for d in datums], device=device)[:, 1:]

    def step(self) -> float:
        self.model.train()
        logits = self.model(input_ids=self.input_ids).logits[:, :-1].float()
        targets = self.input_ids[:, 1:, None]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets)[..., 0]
        loss = -(self.advantages * logprobs * self.mask).sum() / self.mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return float(loss.detach())


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------


def _timed(step: Callable[[], float], device: torch.device) -> tuple[float, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, loss


def measure_mode(
    mode: str, model_dir: str, *, batch: int, seq_len: int, repeats: int, device: str, seed: int
) -> dict[str, Any]:
    lora = {"rank": 0} if mode == "full" else {}
    backend = TorchBackend(
        TorchBackendConfig(
            model=model_dir,
            device=device,
            seed=seed,
            lora=lora,
            learning_rate=LEARNING_RATE,
            max_grad_norm=MAX_GRAD_NORM,
            micro_batch_size=batch,
        )
    )
    vocab = int(backend.model.get_input_embeddings().num_embeddings)
    datums = make_datums(batch, seq_len, vocab, seed)
    plain = PlainLoop(backend, model_dir, datums)
    loss = Reinforce(ReinforceLossConfig())

    def backend_step() -> float:
        metrics = backend.forward_backward(datums, Objective.of(loss))
        backend.optim_step()
        return metrics["loss"]

    first_backend = _timed(backend_step, backend.device)
    first_plain = _timed(plain.step, backend.device)
    times: dict[str, list[float]] = {"backend": [], "plain": []}
    order = [("backend", backend_step), ("plain", plain.step)]
    for repeat in range(repeats):
        for name, step in order if repeat % 2 == 0 else order[::-1]:
            elapsed, _ = _timed(step, backend.device)
            times[name].append(elapsed)
    tokens = batch * seq_len
    backend_s = statistics.median(times["backend"])
    plain_s = statistics.median(times["plain"])
    result = {
        "mode": mode,
        "trainable_parameters": sum(p.numel() for p in backend.trainable_parameters.values()),
        "tokens_per_step": tokens,
        "backend_s_per_step": backend_s,
        "plain_s_per_step": plain_s,
        "backend_tokens_per_s": tokens / backend_s,
        "plain_tokens_per_s": tokens / plain_s,
        "ratio": plain_s / backend_s,
        "backend_times_s": times["backend"],
        "plain_times_s": times["plain"],
        "warmup_s": {"backend": first_backend[0], "plain": first_plain[0]},
        "first_loss": {"backend": first_backend[1], "plain": first_plain[1]},
    }
    backend.close()
    del plain
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = list(os.getloadavg())
    model_dir = str(resolve_model(args.model))
    modes = [
        measure_mode(
            mode,
            model_dir,
            batch=args.batch,
            seq_len=args.seq_len,
            repeats=args.repeats,
            device=args.device,
            seed=args.seed,
        )
        for mode in args.modes
    ]
    goals = [
        {
            "goal": f"{m['mode']}: backend tokens/s / plain tokens/s",
            "value": m["ratio"],
            "target": f">= {GOAL_RATIO:.2f}",
            "passed": m["ratio"] >= GOAL_RATIO,
        }
        for m in modes
    ]
    device = torch.device(args.device if args.device != "auto" else _auto())
    return {
        "model": args.model,
        "model_dir": model_dir,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "seed": args.seed,
        "learning_rate": LEARNING_RATE,
        "max_grad_norm": MAX_GRAD_NORM,
        "environment": {
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "load_average_before": load_before,
        },
        "modes": modes,
        "goals": goals,
    }


def _auto() -> str:
    return "cuda:0" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    line = "  ".join(
        h.ljust(w) if i == 0 else h.rjust(w)
        for i, (h, w) in enumerate(zip(header, widths, strict=True))
    )
    out = [line, "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return out


def render(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"Training throughput: {results['model']}, batch {results['batch']} x"
        f" {results['seq_len']} tokens, {env['device']} ({env['torch_threads']} torch threads),"
        f" median of {results['repeats']} steps after 1 warm-up, torch {env['torch']}",
        "",
    ]
    lines.extend(
        _table(
            [
                "mode",
                "trainable",
                "backend tok/s",
                "plain tok/s",
                "backend/plain",
                "backend s/step",
                "plain s/step",
                "first loss backend / plain",
            ],
            [
                [
                    m["mode"],
                    f"{m['trainable_parameters']:,}",
                    f"{m['backend_tokens_per_s']:,.1f}",
                    f"{m['plain_tokens_per_s']:,.1f}",
                    f"{m['ratio']:.3f}",
                    f"{m['backend_s_per_step']:.3f}",
                    f"{m['plain_s_per_step']:.3f}",
                    f"{m['first_loss']['backend']:.6f} / {m['first_loss']['plain']:.6f}",
                ]
                for m in results["modes"]
            ],
        )
    )
    lines += ["", "Goals"]
    lines.extend(
        _table(
            ["goal", "measured", "target", "result"],
            [
                [g["goal"], f"{g['value']:.3f}", g["target"], "pass" if g["passed"] else "FAIL"]
                for g in results["goals"]
            ],
        )
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="sequences of 64 tokens")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step (default 2)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (512)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per side (5)")
    parser.add_argument(
        "--modes", default="lora,full", help="comma-separated: lora, full (default both)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.seq_len = 64
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in args.modes if mode not in ("lora", "full")]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; use lora, full")
    results = run(args)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0 if all(goal["passed"] for goal in results["goals"]) else 1


if __name__ == "__main__":
    sys.exit(main())
