"""The fake vLLM server held to the real one: one scripted exchange
(:mod:`rllm_core.testing.vllm_exchange`) played against both must get the same statuses and
bodies of the same shape. A change to the fake keeps passing this, or the fake has drifted from
the server it stands for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rllm_core.testing.fakevllm import FakeVllmServer
from rllm_core.testing.vllm_exchange import play, steps

pytestmark = pytest.mark.vllm


def write_adapter(model_dir: Path, out: Path) -> str:
    """A rank-8 PEFT adapter for the model, with non-zero weights."""
    import peft
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft.get_peft_model(model, config).save_pretrained(str(out))
    return str(out)


def copy_model(model_dir: Path, out: Path) -> str:
    """The model folder again, under a versioned name (links, not copies)."""
    out.mkdir(parents=True)
    for item in model_dir.iterdir():
        os.symlink(item, out / item.name)
    return str(out)


def test_the_fake_answers_the_exchange_as_the_real_server_does(
    real_vllm_server, smollm2_model_dir, tmp_path
):
    real_vllm_server.reset()
    script = steps(
        model=real_vllm_server.served_model_name,
        adapter=write_adapter(smollm2_model_dir, tmp_path / "adapter"),
        weights=copy_model(smollm2_model_dir, tmp_path / "weights" / "v1"),
        startup=str(smollm2_model_dir),
    )
    real = play(real_vllm_server.url, script)
    with FakeVllmServer(model=real_vllm_server.served_model_name) as fake:
        faked = play(fake.url, script)
    real_vllm_server.reset()
    assert [a.step for a in faked] == [a.step for a in real]
    differences = [
        f"{r.step}: real {r.status} {r.shape!r} {r.said}\n  fake {f.status} {f.shape!r} {f.said}"
        for r, f in zip(real, faked, strict=True)
        if (r.status, r.shape, r.said) != (f.status, f.shape, f.said)
    ]
    assert not differences, "\n".join(differences)
    # The exchange exercised what it is meant to: successes and each kind of refusal.
    assert {a.status for a in real} == {200, 400, 404, 500}
    assert [a.said for a in real if a.said is not None] == [True]
