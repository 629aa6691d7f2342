"""``rllm-core sft`` end to end on a tiny random Llama over SmolLM2's tokenizer and chat
template: LoRA and full training memorize a few examples (the NLL falls), the run folder holds
what ``rllm-core run`` writes and ``runs show`` reads it, an interrupted run resumes to the
same result, and ``from_run`` trains on a run's rewarded episodes."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from reference.cli_process import run_cli
from reference.run_cuts import cut_steps

EXAMPLES = [
    {
        "messages": [
            {"role": "user", "content": f"Say the word number {n}."},
            {"role": "assistant", "content": word},
        ]
    }
    for n, word in enumerate(["apple", "river", "candle", "orbit"])
]


def write_plan(folder: Path, model: Path, *, lora: str, **sft: object) -> Path:
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES), encoding="utf-8")
    keys = {"data": "train.jsonl", "epochs": 8, "batch_size": 4} | sft
    lines = [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    plan = folder / "sft.toml"
    plan.write_text(
        "\n".join(
            [
                "[run]",
                'name = "sft"',
                "seed = 0",
                "save_every = 3",
                "[sft]",
                *lines,
                "[trainer]",
                'name = "torch"',
                f'model = "{model}"',
                'device = "cpu"',
                "learning_rate = 0.05",
                'lr_schedule = "linear"',
                f"lora = {lora}",
                "[renderer]",
                'name = "chatml"',
                "[[loggers]]",
                'name = "jsonl"',
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    return plan


def run_dir_of(done: subprocess.CompletedProcess[str], cwd: Path) -> Path:
    first = done.stdout.splitlines()[0]
    assert first.startswith("run folder: runs/sft-"), done.stdout + done.stderr
    return cwd / first.removeprefix("run folder: ")


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


LORAS = {
    # The tiny model's logits hang on its random lm_head: LoRA needs an adapter there.
    "lora": '{ rank = 8, alpha = 16.0, target_modules = ["q_proj", "v_proj", "lm_head"] }',
    "full": "{ rank = 0 }",
}


def memorize_plan(folder: Path, model: Path, kind: str) -> Path:
    return write_plan(folder, model, lora=LORAS[kind], eval_data="train.jsonl", export="exported")


@pytest.fixture(scope="module")
def memorized(
    tiny_smol_model_dir, tmp_path_factory
) -> Callable[[str], tuple[Path, subprocess.CompletedProcess[str]]]:
    """``memorized(kind)``: the folder and finished process of the memorizing SFT run with
    ``LORAS[kind]``, run once per module; the resume test takes the LoRA run as its
    uninterrupted run."""
    done: dict[str, tuple[Path, subprocess.CompletedProcess[str]]] = {}

    def get(kind: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
        if kind not in done:
            folder = tmp_path_factory.mktemp(f"sft-{kind}")
            plan = memorize_plan(folder, tiny_smol_model_dir, kind)
            done[kind] = folder, run_cli("sft", str(plan), cwd=folder, timeout=300)
        return done[kind]

    return get


@pytest.mark.parametrize(("kind", "falls_to"), [("lora", 0.5), ("full", 0.5)], ids=LORAS)
def test_sft_memorizes_a_few_examples(memorized, kind, falls_to):
    folder, done = memorized(kind)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 training examples, 4 held out; 8 optimizer steps" in done.stdout
    run_dir = run_dir_of(done, folder)

    lines = metrics(run_dir)
    assert [line["step"] for line in lines] == list(range(1, 9))
    nll = [line["train/nll"] for line in lines]
    assert nll[-1] < falls_to * nll[0], nll
    assert all(line["train/sequences"] == 4.0 for line in lines)
    # Trained tokens: each answer word and the closing <|im_end|>, nothing of the prompt.
    assert all(0 < line["train/tokens"] <= 4 * 4 for line in lines)
    rates = [line["train/learning_rate"] for line in lines]
    assert rates[0] == pytest.approx(0.05)
    assert all(a > b > 0 for a, b in itertools.pairwise(rates))  # decays over the run
    assert "eval/nll" in lines[-1] and "eval/nll" not in lines[0]
    assert lines[-1]["eval/nll"] < nll[0]

    for name in ("plan.toml", "plan.resolved.json", "summary.json", "loss.png", "run.log"):
        assert (run_dir / name).is_file(), name
    assert cut_steps(run_dir / "checkpoints") == [3, 6, 8]
    resolved = json.loads((run_dir / "plan.resolved.json").read_text())
    trainer = next(c for c in resolved["components"] if c["where"] == "[trainer]")
    assert trainer["config"]["total_steps"] == 8
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["last_step"] == 8
    logged = (run_dir / "logs" / "jsonl").read_text()
    assert '"train/nll"' in logged

    shown = run_cli("runs", "show", "--json", str(run_dir), cwd=folder)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert (report["steps_done"], report["steps_planned"]) == (8, 8)
    assert report["sft"]["eval_nll"] == pytest.approx(lines[-1]["eval/nll"])
    assert report["checkpoints"] == [3, 6, 8]
    table = run_cli("runs", "show", str(run_dir), cwd=folder)
    assert table.returncode == 0 and "nll" in table.stdout and "reward" not in table.stdout

    # The exported folder is the trained model on its own: its NLL on the trained tokens is
    # the run's last eval NLL, and an RL plan can name it.
    exported = folder / "exported"
    assert summary["export"] == str(exported)
    assert exported_nll(exported) == pytest.approx(lines[-1]["eval/nll"], abs=1e-4)
    quickstart = Path(__file__).resolve().parent.parent / "examples" / "quickstart" / "plan.toml"
    rl = run_cli(
        "plan",
        "check",
        "--json",
        str(quickstart),
        "--set",
        f'trainer.model="{exported}"',
        cwd=folder,
    )
    assert rl.returncode == 0, rl.stderr
    assert json.loads(rl.stdout)["ok"] is True


def exported_nll(folder: Path) -> float:
    import torch
    from rllm_core.plugins.manager import get_plugin_manager
    from rllm_core.plugins.specs import Kind
    from rllm_core.sft.data import chat_example
    from rllm_core.sft.tokens import tokenize
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoTokenizer.from_pretrained(folder).chat_template
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    spec = get_plugin_manager().get_record(Kind.RENDERER, "chatml").spec
    renderer = spec.build(spec.validate_config({"tokenizer": str(folder)}))
    examples = [
        chat_example(e, str(n), messages_field="messages", tools_field="tools")
        for n, e in enumerate(EXAMPLES)
    ]
    tokens, _ = tokenize(examples, renderer, max_length=None)
    total, count = 0.0, 0
    with torch.no_grad():
        for example in tokens:
            ids = torch.tensor([example.token_ids])
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            picked = logprobs.gather(1, ids[0, 1:, None])[:, 0]
            for value, trained in zip(picked.tolist(), example.trained[1:], strict=True):
                if trained:
                    total -= value
                    count += 1
    return total / count


def test_an_interrupted_sft_run_resumes_to_the_uninterrupted_result(
    memorized, tiny_smol_model_dir, tmp_path
):
    whole, done = memorized("lora")
    assert done.returncode == 0, done.stderr
    expected = metrics(run_dir_of(done, whole))

    cut = tmp_path / "cut"
    cut.mkdir()
    plan = memorize_plan(cut, tiny_smol_model_dir, "lora")
    process = subprocess.Popen(
        [sys.executable, "-m", "rllm_core.cli", "sft", str(plan)],
        cwd=cut,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("step 2/8"):
            process.send_signal(signal.SIGINT)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, "".join(lines) + out + err
    assert "resume with: rllm-core sft" in err
    run_dir = cut / lines[0].strip().removeprefix("run folder: ")
    stopped = metrics(run_dir)
    assert 2 <= len(stopped) < 8

    resumed = run_cli("sft", str(plan), "--resume", str(run_dir), cwd=cut, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {run_dir / 'checkpoints'}" in resumed.stdout
    got = metrics(run_dir)
    assert [line["step"] for line in got] == list(range(1, 9))
    for mine, theirs in zip(got, expected, strict=True):
        assert mine["train/nll"] == theirs["train/nll"]
        assert mine["train/grad_norm"] == theirs["train/grad_norm"]


def write_rl_run(folder: Path, renderer) -> tuple[Path, list[list[int]]]:
    """A run folder as `rllm-core run` leaves it: three episodes (rewards 1, 0, 1), each one
    model call in the deltachain store. Returns the folder and the rewarded episodes' tokens."""
    from rllm_core.run.folder import RunFolder
    from rllm_core.types import Message, TraceRecord
    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    run = RunFolder.create(folder, "rl")
    run.write_plan(
        "",
        {
            "path": "rl.toml",
            "plan": {"run": {"name": "rl"}},
            "components": [
                {
                    "where": "[trace_store]",
                    "kind": "trace_store",
                    "name": "deltachain",
                    "provider": "rllm-trace-store-deltachain",
                    "config": {"path": str(run.traces)},
                }
            ],
        },
    )
    kept = []
    with DeltaChainTraceStore(run.traces) as store:
        for n, (answer, reward) in enumerate([("4", 1.0), ("5", 0.0), ("6", 1.0)]):
            prompt = renderer.render(
                [Message(role="user", content=f"{n}+4?")], add_generation_prompt=True
            ).token_ids
            completion = [*renderer.encode(answer), *renderer.stop_token_ids()[:1]]
            session = f"rl-s1-t{n}"
            store.append(
                TraceRecord(
                    trace_id=f"tr{n}",
                    session_id=session,
                    prompt_delta_token_ids=list(prompt),
                    completion_token_ids=completion,
                    logprobs=[-0.5] * len(completion),
                )
            )
            run.append(
                run.episodes,
                {
                    "step": 1,
                    "episode_id": f"{run.path.name}-s1-t{n}-0-a0",
                    "session_id": session,
                    "task_id": f"t{n}",
                    "reward": reward,
                    "trajectories": [{"lineage_id": "main", "trace_ids": [f"tr{n}"]}],
                },
            )
            if reward >= 1.0:
                kept.append(list(prompt) + completion)
    return run.path, kept


def test_from_run_trains_on_the_rewarded_episodes_tokens(tiny_smol_model_dir, tmp_path):
    from rllm_core.plugins.manager import get_plugin_manager
    from rllm_core.plugins.specs import Kind
    from rllm_core.sft.data import read_run_episodes

    spec = get_plugin_manager().get_record(Kind.RENDERER, "chatml").spec
    renderer = spec.build(spec.validate_config({"tokenizer": str(tiny_smol_model_dir)}))
    run_path, kept = write_rl_run(tmp_path / "rl-runs", renderer)
    examples = list(read_run_episodes(str(run_path), min_reward=1.0))
    assert [list(e.token_ids) for e in examples] == kept
    for example in examples:
        trained = [t for t, m in zip(example.token_ids, example.trained, strict=True) if m]
        assert renderer.decode(trained).startswith(("4", "6"))
    assert len(list(read_run_episodes(str(run_path), min_reward=None))) == 3

    plan = write_plan(tmp_path, tiny_smol_model_dir, lora="{ rank = 4 }", epochs=2)
    text = plan.read_text().replace(
        'data = "train.jsonl"', f'from_run = "{run_path}"\nmin_reward = 1.0'
    )
    plan.write_text(text)
    check = run_cli("plan", "check", str(plan), cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    done = run_cli("sft", str(plan), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 training examples; 2 optimizer steps" in done.stdout
    lines = metrics(run_dir_of(done, tmp_path))
    assert [line["train/sequences"] for line in lines] == [2.0, 2.0]
    assert lines[0]["train/tokens"] == float(sum(sum(e.trained) for e in examples))


def test_a_bad_example_stops_sft_before_any_folder_naming_file_and_line(
    tiny_smol_model_dir, tmp_path
):
    plan = write_plan(tmp_path, tiny_smol_model_dir, lora="{ rank = 4 }")
    data = tmp_path / "train.jsonl"
    data.write_text(data.read_text() + '{"messages": [{"role": "user", "content": "hi"}]}\n')
    done = run_cli("sft", str(plan), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{data}:5: no assistant message" in done.stderr
    assert not (tmp_path / "runs").exists()
    # With --json, a failure before any summary leaves stdout empty, as its help says.
    as_json = run_cli("sft", str(plan), "--json", cwd=tmp_path)
    assert (as_json.returncode, as_json.stdout) == (2, ""), as_json.stderr
    assert f"{data}:5: no assistant message" in as_json.stderr
