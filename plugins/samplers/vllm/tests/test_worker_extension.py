"""The worker extension vLLM's server imports (``vllm_worker/rllm_vllm_worker.py``): it needs
nothing vLLM lacks, and after a reload it processes again exactly the layers that share a
weight. Against a real vLLM server it is exercised by ``tests/test_vllm_real_sampler.py``."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import rllm_sampler_vllm

torch = pytest.importorskip("torch")

FILE = Path(rllm_sampler_vllm.__file__).parent / "vllm_worker" / "rllm_vllm_worker.py"


def load_extension():
    spec = importlib.util.spec_from_file_location("rllm_vllm_worker", FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_imports_only_the_standard_library():
    tree = ast.parse(FILE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.partition(".")[0])
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported


class _Processing:
    """A layer's quant method: records which layers were processed again."""

    def __init__(self, seen: list[str], name: str) -> None:
        self.seen, self.name = seen, name

    def process_weights_after_loading(self, layer) -> None:
        self.seen.append(self.name)


def test_the_layers_sharing_a_weight_are_processed_again_and_no_other():
    seen: list[str] = []
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(8, 4)
    model.body = torch.nn.Linear(4, 4)
    model.head = torch.nn.Linear(4, 8, bias=False)
    model.head.weight = model.embed.weight
    model.norm = torch.nn.LayerNorm(4)
    for name in ("embed", "body", "head"):
        getattr(model, name).quant_method = _Processing(seen, name)

    class Runner:
        def get_model(self):
            return model

    worker = load_extension().WorkerExtension()
    worker.model_runner = Runner()
    assert worker.rllm_refresh_tied_weights() == ["embed", "head"]
    assert seen == ["embed", "head"]

    model.head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())
    seen.clear()
    assert worker.rllm_refresh_tied_weights() == []
    assert seen == []
