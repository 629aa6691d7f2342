"""What a ``tokenizers`` pipeline does to text before its model sees it, read from the
tokenizer's configuration: the facts :mod:`rllm_renderer_chatml.segments` and
:mod:`rllm_renderer_chatml.words` check before taking their shortcuts."""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer

__all__ = ["components", "pipeline"]


def pipeline(tokenizer: Tokenizer) -> dict[str, Any]:
    """The parts of a tokenizer's configuration that decide how text is cut: ``normalizer``,
    ``pre_tokenizer`` and ``post_processor`` as their JSON objects (``None`` when absent), and
    ``model`` with its type and BPE options. Read part by part: serializing the whole
    tokenizer would copy its vocabulary."""
    parts: dict[str, Any] = {}
    for name in ("normalizer", "pre_tokenizer", "post_processor"):
        part = getattr(tokenizer, name)
        parts[name] = None if part is None else json.loads(part.__getstate__())
    model = tokenizer.model
    parts["model"] = {
        "type": type(model).__name__,
        **{
            key: getattr(model, key, None)
            for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix")
        },
    }
    return parts


def components(node: Any) -> list[dict[str, Any]]:
    """A pipeline stage and, for a ``Sequence``, the stages inside it, flattened."""
    if not isinstance(node, dict):
        return []
    inner = node.get("pretokenizers") or node.get("normalizers") or node.get("processors")
    if node.get("type") == "Sequence" and isinstance(inner, list):
        return [c for child in inner for c in components(child)]
    return [node]
