"""The baseline of the quickstart benchmark: a bare GRPO loop with no framework in the path.

What one writes by hand to teach SmolLM2-135M-Instruct the quickstart's arithmetic: the same
model, task file, system prompt, reward, seed, batch shape and optimizer settings as
``examples/quickstart/plan.toml``, read from that plan, and nothing else:

- each step takes ``batch_size`` questions in the plan's seeded data order and samples
  ``group_size`` replies to each with one batched ``model.generate`` call (left-padded, the
  plan's temperature, top-p and ``max_tokens``, stopping at the end-of-turn token);
- rewards come from the jsonl task source's own numeric reward (with the first-number credit);
- advantages are GRPO's: reward minus the group mean, divided by the group's standard deviation;
- the loss is the on-policy policy gradient ``-mean over action tokens of A * logprob`` (the
  DPPO-TV loss of the plan has the same gradient on the first pass over fresh samples), one
  backward over the whole batch, gradient clipping at 1.0 and an AdamW step on LoRA adapters
  with the plan's rank, alpha and learning rate.

No gateway, no sandbox, no trace store, no harness: the figures are what the framework's run
must match with all of those in the path. Run from the repository root (the quickstart
benchmark runs it as a subprocess, back to back with the framework)::

    .venv/bin/python benchmarks/bare_grpo.py            # a table
    .venv/bin/python benchmarks/bare_grpo.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"


def load_settings(plan_path: Path) -> dict[str, Any]:
    plan = tomllib.loads(plan_path.read_text(encoding="utf-8"))
    algorithm, sampling, trainer = plan["algorithm"], plan["sampling"], plan["trainer"]
    tasks = plan["tasks"]
    return {
        "seed": plan["run"]["seed"],
        "steps": plan["run"]["steps"],
        "batch_size": algorithm["batch_size"],
        "group_size": algorithm["group_size"],
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "max_tokens": sampling["max_tokens"],
        "model": trainer["model"],
        "learning_rate": trainer["learning_rate"],
        "lora_rank": trainer["lora"]["rank"],
        "lora_alpha": trainer["lora"]["alpha"],
        "system_prompt": plan["harness"]["system_prompt"],
        "tasks": plan_path.parent / tasks["path"],
        "first_number_credit": tasks.get("first_number_credit", 0.0),
    }


def run(plan_path: Path, steps: int | None = None) -> dict[str, Any]:
    started = time.monotonic()
    import torch
    from peft import LoraConfig, get_peft_model
    from rllm_core.models import resolve_model
    from rllm_core.run.state import DataOrder
    from rllm_task_source_jsonl.rewards import numeric_match
    from rllm_trainer_backend_torch.plugin import DEFAULT_TARGET_MODULES
    from transformers import AutoModelForCausalLM, AutoTokenizer

    s = load_settings(plan_path)
    if steps is not None:
        s["steps"] = steps
    torch.manual_seed(s["seed"])
    folder = resolve_model(s["model"])
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = get_peft_model(
        model,
        LoraConfig(
            r=s["lora_rank"],
            lora_alpha=s["lora_alpha"],
            lora_dropout=0.0,
            target_modules=list(DEFAULT_TARGET_MODULES),
        ),
    )
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=s["learning_rate"], weight_decay=0.0
    )
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_turn
    rows = [json.loads(line) for line in s["tasks"].read_text().splitlines() if line.strip()]
    order = DataOrder(size=len(rows), seed=s["seed"])
    load_s = time.monotonic() - started

    steps: list[dict[str, float]] = []
    for step in range(1, s["steps"] + 1):
        step_start = time.monotonic()
        batch = [rows[i] for i in order.take(s["batch_size"])]
        prompts = [
            tokenizer.apply_chat_template(
                [
                    {"role": "system", "content": s["system_prompt"]},
                    {"role": "user", "content": row["question"]},
                ],
                tokenize=False,
                add_generation_prompt=True,
            )
            for row in batch
            for _ in range(s["group_size"])
        ]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True)
        model.eval()
        with torch.no_grad():
            generated = model.generate(
                **encoded,
                do_sample=True,
                temperature=s["temperature"],
                top_p=s["top_p"],
                top_k=0,
                max_new_tokens=s["max_tokens"],
                eos_token_id=end_of_turn,
                pad_token_id=pad,
            )
        prompt_len = encoded["input_ids"].shape[1]
        completions = generated[:, prompt_len:]
        action = torch.ones_like(completions, dtype=torch.bool)
        for r in range(completions.shape[0]):
            ends = (completions[r] == end_of_turn).nonzero()
            if len(ends):
                action[r, int(ends[0]) + 1 :] = False
        replies = [
            tokenizer.decode(completions[r][action[r]], skip_special_tokens=True)
            for r in range(completions.shape[0])
        ]
        answers = [row["answer"] for row in batch for _ in range(s["group_size"])]
        rewards = torch.tensor(
            [
                numeric_match(reply, str(answer), first_number_credit=s["first_number_credit"])[0]
                for reply, answer in zip(replies, answers, strict=True)
            ]
        )
        groups = rewards.view(s["batch_size"], s["group_size"])
        advantages = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)
        rollout_s = time.monotonic() - step_start

        train_start = time.monotonic()
        model.train()
        attention = torch.cat([encoded["attention_mask"], action.long()], dim=1)
        logits = model(input_ids=generated, attention_mask=attention).logits
        logprobs = torch.log_softmax(logits[:, prompt_len - 1 : -1].float(), dim=-1)
        taken = logprobs.gather(-1, completions[..., None])[..., 0]
        mask = action.float()
        loss = -(advantages.view(-1, 1) * taken * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps.append(
            {
                "step": step,
                "reward_mean": float(rewards.mean()),
                "loss": float(loss.detach()),
                "rollout_s": rollout_s,
                "train_s": time.monotonic() - train_start,
            }
        )
        print(
            f"step {step}: reward {steps[-1]['reward_mean']:.3f}"
            f" rollout {rollout_s:.1f}s train {steps[-1]['train_s']:.1f}s",
            file=sys.stderr,
        )
    rewards_by_step = [row["reward_mean"] for row in steps]
    return {
        "steps": steps,
        "first5_reward": sum(rewards_by_step[:5]) / len(rewards_by_step[:5]),
        "last5_reward": sum(rewards_by_step[-5:]) / len(rewards_by_step[-5:]),
        "load_s": load_s,
        "rollout_s": sum(row["rollout_s"] for row in steps),
        "train_s": sum(row["train_s"] for row in steps),
        "wall_s": time.monotonic() - started,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plan", type=Path, default=PLAN, help="the plan to mirror")
    parser.add_argument("--steps", type=int, default=None, help="override run.steps")
    args = parser.parse_args(argv)
    figures = run(args.plan, args.steps)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{'step':>4}  {'reward':>7}  {'rollout s':>9}  {'train s':>7}")
    for row in figures["steps"]:
        print(
            f"{row['step']:>4}  {row['reward_mean']:>7.3f}  {row['rollout_s']:>9.1f}"
            f"  {row['train_s']:>7.1f}"
        )
    print(
        f"first 5 steps {figures['first5_reward']:.3f}, last 5 steps {figures['last5_reward']:.3f},"
        f" wall {figures['wall_s']:.0f} s (model load {figures['load_s']:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
