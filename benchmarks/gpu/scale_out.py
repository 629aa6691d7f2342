"""Scale-out figures on a machine with GPUs and vLLM: the quickstart sampled by vLLM, by the torch
backend's own sampler and by ``model.generate``, and a full-training step over 2 GPUs with FSDP.

Each case runs ``examples/quickstart/plan.toml`` for ``--steps`` steps (3 by default) on
``cuda``, one after the other, each ``rllm-core run`` its own process from the repository root:

1. ``vllm``: the plan with ``[sampler] name = "vllm"``, kept on the policy after every optimizer
   step (the trainer exports each LoRA version to ``weights_dir`` and the servers load it as a
   runtime adapter). The sampler starts ``vllm serve`` on the plan's model itself
   (``[sampler.serve]``) unless the script is given ``--vllm-url`` (servers started with
   ``--enable-lora --max-lora-rank 16 --logprobs-mode processed_logprobs`` and
   ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, reading the same ``weights_dir``);
2. ``torch sampler``: the same plan sampled by the torch backend's own sampler;
3. ``generate``: ``model.generate`` in this process, on the quickstart's first batch of prompts
   (``batch_size x group_size`` of them, the plan's temperature, top-p and ``max_tokens``);
4. ``fsdp``: the plan with full training (``trainer.lora.rank = 0``) over
   ``trainer.parallel = { world_size = 2, strategy = "fsdp" }``: ``rllm-core run`` starts the two
   ranks through ``torch.distributed.run``. Its figure is the train time per step.

Sampler tokens per second are completion tokens over the rollout phases' wall time
(``tokens_sampled / rollout_s`` of the run's ``summary.json``), and for ``generate`` new tokens
over the call's wall time.

Run from the repository root (needs rllm-core with the torch trainer and the vllm sampler, the
quickstart model pulled, ``vllm`` installed and two GPUs)::

    python benchmarks/gpu/scale_out.py                  # a table
    python benchmarks/gpu/scale_out.py --json           # one JSON object
    python benchmarks/gpu/scale_out.py --vllm-url http://10.0.0.5:8000
    python benchmarks/gpu/scale_out.py --dry-run        # the plans and commands; no GPU needed

``--dry-run`` prints every command and plan override it would run, checks the plans as ``rllm-core
plan check`` does, and exits 0 (2 when a plan does not check).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"
sys.path.insert(0, str(ROOT / "benchmarks"))

from _tables import right_aligned  # noqa: E402

FSDP_WORLD_SIZE = 2
VLLM_READY_S = 600.0


def case_overrides(
    steps: int, output_dir: Path, vllm_urls: Sequence[str], model_dir: Path
) -> dict[str, list[str]]:
    """The ``--set`` assignments of each ``rllm-core run`` case over the quickstart plan."""
    common = [f"run.steps={steps}", f"run.output_dir={json.dumps(str(output_dir / 'runs'))}"]
    common += ['trainer.device="cuda"']
    if vllm_urls:
        source = "sampler.urls=[" + ", ".join(json.dumps(url) for url in vllm_urls) + "]"
    else:
        source = f"sampler.serve={{model = {json.dumps(str(model_dir))}, max_lora_rank = 16}}"
    return {
        "vllm": [
            *common,
            'sampler.name="vllm"',
            source,
            f"sampler.weights_dir={json.dumps(str(output_dir / 'weights'))}",
        ],
        "torch sampler": common,
        "fsdp": [
            *common,
            "trainer.lora.rank=0",
            f'trainer.parallel={{world_size = {FSDP_WORLD_SIZE}, strategy = "fsdp"}}',
        ],
    }


def run_command(overrides: Sequence[str]) -> list[str]:
    command = [sys.executable, "-m", "rllm_core", "run", str(PLAN), "--plain"]
    for item in overrides:
        command += ["--set", item]
    return command


def check_plans(cases: dict[str, list[str]]) -> list[str]:
    """Each case's plan checked as ``rllm-core plan check`` does; the problems found."""
    from rllm_core.errors import ModelError, PlanError
    from rllm_core.run.components import prepare_plan

    problems = []
    for name, overrides in cases.items():
        try:
            prepare_plan(PLAN, overrides, run_dir=Path("<run folder>"))
        except (PlanError, ModelError) as exc:
            problems.append(f"{name}: {exc}")
    return problems


def quickstart_settings() -> dict[str, Any]:
    import tomllib

    plan = tomllib.loads(PLAN.read_text(encoding="utf-8"))
    return {
        "model": plan["trainer"]["model"],
        "lora_rank": plan["trainer"]["lora"]["rank"],
        "tasks": (PLAN.parent / plan["tasks"]["path"]).resolve(),
        "system_prompt": plan["harness"]["system_prompt"],
        "prompts": plan["algorithm"]["batch_size"] * plan["algorithm"]["group_size"],
        "group_size": plan["algorithm"]["group_size"],
        **plan["sampling"],
    }


def run_case(name: str, overrides: Sequence[str], output_dir: Path) -> dict[str, Any]:
    before = set(output_dir.glob("quickstart-*"))
    started = time.monotonic()
    done = subprocess.run(run_command(overrides), cwd=ROOT, capture_output=True, text=True)
    wall_s = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: rllm-core run exited {done.returncode}:\n{done.stderr[-4000:]}")
    (folder,) = set(output_dir.glob("quickstart-*")) - before
    summary = json.loads((folder / "summary.json").read_text())
    steps = max(1, int(summary.get("steps", 1)))
    return {
        "wall_s": wall_s,
        "rollout_s": summary["rollout_s"],
        "train_s": summary["train_s"],
        "train_step_s": summary["train_s"] / steps,
        "tokens_sampled": summary["tokens_sampled"],
        "sampler_tokens_per_s": summary["tokens_sampled"] / summary["rollout_s"],
        "reward_last": summary.get("reward_last"),
        "run_folder": str(folder),
    }


def generate_case(settings: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """``model.generate`` on the quickstart's first batch of prompts on cuda."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to("cuda")
    tasks = [json.loads(line) for line in settings["tasks"].read_text().splitlines() if line]
    questions = [t["question"] for t in tasks][: settings["prompts"] // settings["group_size"]]
    texts = [
        tokenizer.apply_chat_template(
            [
                {"role": "system", "content": settings["system_prompt"]},
                {"role": "user", "content": q},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        for q in questions
        for _ in range(settings["group_size"])
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True).to("cuda")
    options = {
        "max_new_tokens": settings["max_tokens"],
        "do_sample": True,
        "temperature": settings["temperature"],
        "top_p": settings["top_p"],
        "pad_token_id": tokenizer.pad_token_id or tokenizer.eos_token_id,
    }
    model.generate(**batch, **(options | {"max_new_tokens": 2}))
    torch.cuda.synchronize()
    started = time.monotonic()
    out = model.generate(**batch, **options)
    torch.cuda.synchronize()
    elapsed = time.monotonic() - started
    new = out[:, batch["input_ids"].shape[1] :]
    eos = tokenizer.eos_token_id
    tokens = int(sum(int((row != eos).sum()) + int((row == eos).any()) for row in new))
    return {"wall_s": elapsed, "tokens": tokens, "sampler_tokens_per_s": tokens / elapsed}


def measure(args: argparse.Namespace, output_dir: Path) -> dict[str, Any]:
    import torch
    from rllm_core.models.store import resolve_model

    if torch.cuda.device_count() < FSDP_WORLD_SIZE:
        raise SystemExit(f"needs {FSDP_WORLD_SIZE} GPUs, found {torch.cuda.device_count()}")
    settings = quickstart_settings()
    model_dir = resolve_model(settings["model"])
    cases = case_overrides(args.steps, output_dir, args.vllm_url, model_dir)
    runs = output_dir / "runs"
    results: dict[str, Any] = {"steps": args.steps, "vllm_urls": args.vllm_url}
    results["vllm"] = run_case("vllm", cases["vllm"], runs)
    results["torch_sampler"] = run_case("torch sampler", cases["torch sampler"], runs)
    results["generate"] = generate_case(settings, model_dir)
    results["fsdp"] = run_case("fsdp", cases["fsdp"], runs)
    results["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return results


def render(results: dict[str, Any]) -> str:
    rows = [
        [label, f"{results[key]['sampler_tokens_per_s']:.0f}"]
        for label, key in (
            ("vLLM sampler (quickstart rollouts)", "vllm"),
            ("torch sampler (quickstart rollouts)", "torch_sampler"),
            ("model.generate (first batch)", "generate"),
        )
    ]
    lines = list(right_aligned(["sampler", "tokens/s"], rows, left=1))
    lines.append("")
    fsdp = results["fsdp"]
    lines.extend(
        right_aligned(
            ["training", "s/step"],
            [
                [
                    f"full, FSDP over {FSDP_WORLD_SIZE} GPUs",
                    f"{fsdp['train_step_s']:.2f}",
                ],
                [
                    "LoRA, 1 GPU (torch sampler run)",
                    f"{results['torch_sampler']['train_step_s']:.2f}",
                ],
            ],
            left=1,
        )
    )
    lines.append("")
    lines.append(f"{results['steps']} steps each; GPUs: {', '.join(results['gpus'])}")
    return "\n".join(lines)


def dry_run(args: argparse.Namespace, output_dir: Path) -> int:
    from rllm_core.models.store import resolve_model

    settings = quickstart_settings()
    cases = case_overrides(args.steps, output_dir, args.vllm_url, resolve_model(settings["model"]))
    for name, overrides in cases.items():
        print(f"# {name}: {PLAN.relative_to(ROOT)} with")
        for item in overrides:
            print(f"#   {item}")
        print(shlex.join(run_command(overrides)))
    print(
        f"# generate: model.generate on {settings['prompts']} quickstart prompts,"
        f" max_new_tokens={settings['max_tokens']}, temperature={settings['temperature']}"
    )
    problems = check_plans(cases)
    for problem in problems:
        print(f"plan error: {problem}", file=sys.stderr)
    if not problems:
        print(f"plans ok: {', '.join(cases)}")
    return 2 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dry-run", action="store_true", help="print the plans and commands")
    parser.add_argument(
        "--vllm-url",
        action="append",
        default=[],
        metavar="URL",
        help="a running vLLM server (repeatable); by default the sampler starts vllm serve",
    )
    parser.add_argument("--steps", type=int, default=3, help="steps of each run (default 3)")
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="keep the run folders here (default: temp)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="scale-out-") as temporary:
        output_dir = (args.output_dir or Path(temporary)).resolve()
        if args.dry_run:
            return dry_run(args, output_dir)
        results = measure(args, output_dir)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
