"""Chat JSONL for SFT on real tokenizers: the per-message ``trainable`` flag through the
SmolLM2 ChatML renderer, and rows written by ``rllm-core dataset`` loading into SFT."""

from __future__ import annotations

import json
from pathlib import Path

from rllm_core.plugins.manager import get_plugin_manager
from rllm_core.plugins.specs import Kind
from rllm_core.sft.data import load_examples
from rllm_core.sft.tokens import tokenize

FIELDS = {"messages_field": "messages", "tools_field": "tools"}


def renderer(name: str, tokenizer: Path):
    spec = get_plugin_manager().get_record(Kind.RENDERER, name).spec
    return spec.build(spec.validate_config({"tokenizer": str(tokenizer)}))


def trained_text(renderer, example) -> str:
    pairs = zip(example.token_ids, example.trained, strict=True)
    return renderer.decode([t for t, m in pairs if m])


def test_trainable_false_trains_none_of_the_answer_and_its_close(tmp_path, smollm2_tokenizer_dir):
    smol = renderer("chatml", smollm2_tokenizer_dir)
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "It is five."},
        {"role": "user", "content": "Check again."},
        {"role": "assistant", "content": "It is four."},
    ]
    flagged = [dict(m) for m in messages]
    flagged[1]["trainable"] = False
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in (messages, flagged)))
    (plain, masked), report = tokenize(
        load_examples(str(path), format="auto", **FIELDS), smol, max_length=None
    )
    assert report.kept == 2 and plain.token_ids == masked.token_ids
    assert trained_text(smol, plain) == "It is five.<|im_end|>It is four.<|im_end|>"
    assert trained_text(smol, masked) == "It is four.<|im_end|>"
    # the flag removes exactly the first answer's tokens, nothing else
    removed = [a and not b for a, b in zip(plain.trained, masked.trained, strict=True)]
    assert not any(b and not a for a, b in zip(plain.trained, masked.trained, strict=True))
    pairs = zip(plain.token_ids, removed, strict=True)
    assert smol.decode([t for t, r in pairs if r]) == "It is five.<|im_end|>"


def test_imported_think_blocks_train_as_the_qwen3_renderer_writes_them(
    tmp_path, qwen3_tokenizer_dir
):
    from click.testing import CliRunner
    from rllm_core.cli import main

    qwen3 = renderer("qwen3", qwen3_tokenizer_dir)
    source = tmp_path / "field.jsonl"
    content = "<think>\nTwo and two.\n</think>\n\n4"
    row = {
        "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": content}]
    }
    source.write_text(json.dumps(row) + "\n")
    out = tmp_path / "train.jsonl"
    result = CliRunner().invoke(main, ["dataset", "import", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    (example,), report = tokenize(
        load_examples(str(out), format="auto", **FIELDS), qwen3, max_length=None
    )
    assert report.kept == 1
    assert example.origin == f"{out}:1"
    # the separate reasoning renders back into the think block the dataset had, all trained
    assert trained_text(qwen3, example) == content + "<|im_end|>"
