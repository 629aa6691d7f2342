"""The torch backend on torch.distributed: two CPU ranks over gloo, started by torchrun, train
as one process does (LoRA with DDP, full training with FSDP2), write sharded checkpoints that
resume at world size 1, and report a failure on rank 1 on rank 0.

Run as a script, this file is the worker torchrun starts: ``scenario`` and a JSON job come on
the command line; rank 0 writes what it saw into the job's ``out`` folder.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

VOCAB = 512
STEPS = (
    {"seed": 0, "lengths": (7, 4, 9, 5, 6)},  # 3 micro-batches of 2: 2 on rank 0, 1 on rank 1
    {"seed": 1, "lengths": (8, 3)},  # one micro-batch: rank 1 runs a zero-loss pass only
)
LORA = {"lora": {"rank": 4, "alpha": 8.0}, "micro_batch_size": 2, "learning_rate": 1e-2}
FULL = {"lora": {"rank": 0}, "micro_batch_size": 2, "learning_rate": 1e-3}


def make_datums(seed: int, lengths: tuple[int, ...]) -> list[Any]:
    from rllm_trainer_backend_torch.testing import random_datums

    return random_datums(seed, lengths, vocab=VOCAB)


NEXT_STEP = make_datums(seed=7, lengths=(6, 5, 7))


def make_objective(kind: str) -> Any:
    from rllm_core.algorithms.objective import Objective, RolloutCorrection

    if kind == "dppo":
        from rllm_loss_dppo.loss import DPPOTV
        from rllm_loss_dppo.plugin import DPPOTVConfig

        return Objective.of(DPPOTV(DPPOTVConfig()), correction=RolloutCorrection(tis_cap=2.0))
    if kind == "failing":
        return Objective.of(FailsOnRankOne())
    from rllm_loss_ppo.plugin import ReinforceLossConfig
    from rllm_loss_ppo.reinforce import Reinforce

    return Objective.of(Reinforce(ReinforceLossConfig()))


class FailsOnRankOne:
    """Reduces ``-A * logprobs``; raises on rank 1 (this class pickles by reference to the
    worker script, which every rank runs as ``__main__``)."""

    name = "fails-on-rank-one"

    def __call__(self, ctx: Any) -> Any:
        import torch.distributed as dist
        from rllm_core.ports import LossOutput

        if dist.is_initialized() and dist.get_rank() == 1:
            raise ValueError("injected failure on rank one")
        return LossOutput(loss=ctx.aggregate(-ctx.advantages * ctx.logprobs, ctx.action_mask))


def build(job: dict[str, Any], world_size: int) -> Any:
    from rllm_trainer_backend_torch.backend import TorchBackend
    from rllm_trainer_backend_torch.plugin import TorchBackendConfig

    values = {
        "model": job["model"],
        "device": "cpu",
        "cpu_threads": 1,
        **job["config"],
        "parallel": {"world_size": world_size, **job.get("parallel", {})},
    }
    return TorchBackend(TorchBackendConfig(**values))


def train(backend: Any, objective: Any) -> list[dict[str, float]]:
    metrics = []
    for step in STEPS:
        metrics.append(backend.forward_backward(make_datums(**step), objective))
        metrics.append(backend.optim_step())
    return metrics


def worker(scenario: str, job: dict[str, Any]) -> None:
    backend = build(job, world_size=int(os.environ["WORLD_SIZE"]))
    if backend.rank != 0:
        backend.follow()
        return
    out = Path(job["out"])
    try:
        report: dict[str, Any] = {}
        if scenario == "train":
            backend.save_state(str(out / "initial"))
            report["metrics"] = train(backend, make_objective(job["loss"]))
            report["logprobs"] = backend.compute_logprobs(make_datums(**STEPS[0]))
            backend.save_weights(str(out / "weights"))
            backend.save_state(str(out / "sharded"))
            report["sampler_weights"] = sampler_sees_release(backend, out / "weights")
            exported = backend.export_weights(str(out / "export"))
            report["export"] = [exported.kind, exported.version, sorted(os.listdir(exported.path))]
            # Resume at world size 2 from the sharded checkpoint and from its consolidation.
            from rllm_trainer_backend_torch.sharded import consolidate

            consolidated = consolidate(out / "sharded", out / "consolidated-by-rank-0")
            for source, release in ((out / "sharded", "resumed"), (consolidated, "resumed-1")):
                backend.load_state(str(source))
                backend.forward_backward(NEXT_STEP, make_objective(job["loss"]))
                backend.optim_step()
                backend.save_weights(str(out / release))
        elif scenario == "fail":
            try:
                backend.forward_backward(make_datums(**STEPS[0]), make_objective("failing"))
            except Exception as exc:
                report["error"] = f"{type(exc).__name__}: {exc}"
            report["after"] = backend.forward_backward(
                make_datums(**STEPS[0]), make_objective("reinforce")
            )
            try:
                backend.sampler()
                report["rank0_sampler"] = True
            except RuntimeError:
                report["rank0_sampler"] = False
        (out / "report.json").write_text(json.dumps(report), encoding="utf-8")
    finally:
        backend.close()


def sampler_sees_release(backend: Any, folder: Path) -> bool:
    """Whether the model rank 0's sampler decodes with holds the released weights."""
    import torch
    from safetensors.torch import load_file

    sampler = backend.sampler()
    released = load_file(str(folder / "weights.safetensors"))
    params = dict(sampler._model.named_parameters())
    return all(torch.equal(params[name].detach(), tensor) for name, tensor in released.items())


# ---------------------------------------------------------------- the tests

import pytest  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama-dist")
    # Tied input and output embeddings, as SmolLM2 has: a frozen weight under two names.
    model = tiny_llama(1234, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True)
    model.save_pretrained(folder)
    return folder


def launch(scenario: str, job: dict[str, Any], *, timeout: float = 150) -> dict[str, Any]:
    """Run this file under torchrun with two CPU ranks; return rank 0's report."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        __file__,
        scenario,
        json.dumps(job),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-6000:]
    return json.loads((Path(job["out"]) / "report.json").read_text(encoding="utf-8"))


def close(a: dict[str, float], b: dict[str, float], rel: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=rel, abs=1e-7), key


@pytest.mark.parametrize(
    ("config", "loss", "strategy"),
    [(LORA, "dppo", "ddp"), (FULL, "reinforce", "fsdp")],
    ids=["lora-ddp", "full-fsdp"],
)
def test_two_ranks_train_as_one_process_and_resume_at_world_size_one(
    tiny_model_dir: Path, tmp_path: Path, config, loss, strategy
):
    import torch
    from rllm_trainer_backend_torch.sharded import consolidate
    from rllm_trainer_backend_torch.testing import assert_same_state
    from safetensors.torch import load_file

    job = {
        "model": str(tiny_model_dir),
        "config": config,
        "parallel": {"strategy": strategy},
        "loss": loss,
        "out": str(tmp_path),
    }
    report = launch("train", job)

    single = build(job, world_size=1)
    metrics = train(single, make_objective(loss))
    for got, want in zip(report["metrics"], metrics, strict=True):
        close(got, want)
    logprobs = single.compute_logprobs(make_datums(**STEPS[0]))
    for got_row, want_row in zip(report["logprobs"], logprobs, strict=True):
        assert got_row == pytest.approx(want_row, abs=1e-5)
    released = load_file(str(tmp_path / "weights" / "weights.safetensors"))
    expected = single.trainable_parameters
    assert released.keys() == expected.keys()
    assert report["sampler_weights"] is True
    kind, version, files = report["export"]
    assert (kind, version) == ("lora" if strategy == "ddp" else "full", len(STEPS))
    assert ("adapter_model.safetensors" if kind == "lora" else "model.safetensors") in files
    for name, tensor in released.items():
        torch.testing.assert_close(tensor, expected[name].detach(), rtol=0, atol=1e-5, msg=name)

    # The sharded checkpoint of world size 2, read at world size 1, directly or consolidated.
    state = json.loads((tmp_path / "sharded" / "state.json").read_text(encoding="utf-8"))
    assert (state["layout"], state["world_size"]) == ("sharded", 2)
    # With LoRA rank 0 also wrote the adapters as a PEFT adapter folder.
    adapter = tmp_path / "sharded" / "adapter" / "adapter_model.safetensors"
    assert adapter.is_file() == (strategy == "ddp")
    if adapter.is_file():
        saved = load_file(str(adapter))
        assert saved.keys() == {name.replace(".default", "") for name in released}
        for name, tensor in released.items():
            assert torch.equal(saved[name.replace(".default", "")], tensor), name
    direct, merged = build(job, world_size=1), build(job, world_size=1)
    direct.load_state(str(tmp_path / "sharded"))
    merged.load_state(str(consolidate(tmp_path / "sharded", tmp_path / "consolidated")))
    assert_same_state(direct, merged)
    for name, param in direct.trainable_parameters.items():
        assert torch.equal(param.detach(), released[name]), name
    assert direct.optimizer_steps == len(STEPS)
    for backend in (direct, merged):
        backend.forward_backward(NEXT_STEP, make_objective(loss))
        backend.optim_step()
    assert_same_state(direct, merged)
    # Saved before the first step: the optimizer has no state yet, as in a fresh backend.
    fresh, initial = build(job, world_size=1), build(job, world_size=1)
    initial.load_state(str(tmp_path / "initial"))
    assert_same_state(fresh, initial)
    for backend in (fresh, initial):
        backend.forward_backward(NEXT_STEP, make_objective(loss))
        backend.optim_step()
    assert_same_state(fresh, initial)
    # World size 2 resumed from either checkpoint continues as world size 1 does.
    for release in ("resumed", "resumed-1"):
        resumed = load_file(str(tmp_path / release / "weights.safetensors"))
        for name, param in direct.trainable_parameters.items():
            torch.testing.assert_close(resumed[name], param.detach(), rtol=0, atol=1e-5)
    for backend in (single, direct, merged, fresh, initial):
        backend.close()


def test_a_failure_on_rank_one_raises_on_rank_zero_naming_it(tiny_model_dir: Path, tmp_path):
    job = {"model": str(tiny_model_dir), "config": LORA, "out": str(tmp_path)}
    report = launch("fail", job)
    assert report["error"].startswith("RankFailure: rank 1 of 2 failed in forward_backward")
    assert "injected failure on rank one" in report["error"]
    single = build(job, world_size=1)
    close(report["after"], single.forward_backward(make_datums(**STEPS[0]), make_objective("x")))
    assert report["rank0_sampler"] is True
    single.close()


def test_a_parallel_backend_outside_torchrun_says_how_to_launch(tiny_model_dir, monkeypatch):
    from rllm_core.errors import ComponentError

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ComponentError, match=r"world_size is 2 but .*not set.*torchrun"):
        build({"model": str(tiny_model_dir), "config": LORA}, world_size=2)


def test_fsdp_with_lora_is_refused():
    from rllm_core.errors import ComponentError
    from rllm_core.ports import ParallelSettings
    from rllm_trainer_backend_torch.distributed import resolve_strategy, share

    with pytest.raises(ComponentError, match=r"strategy = 'fsdp' .* use strategy = 'ddp'"):
        resolve_strategy(ParallelSettings(world_size=2, strategy="fsdp"), full=False)
    assert resolve_strategy(ParallelSettings(world_size=2), full=True) == "fsdp"
    assert [list(share(3, 2, rank)) for rank in (0, 1)] == [[0, 1], [2]]
    assert [list(share(1, 2, rank)) for rank in (0, 1)] == [[0], []]


if __name__ == "__main__":
    worker(sys.argv[1], json.loads(sys.argv[2]))
