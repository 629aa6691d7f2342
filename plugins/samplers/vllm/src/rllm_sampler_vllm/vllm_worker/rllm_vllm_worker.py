"""Methods the vLLM sampler adds to vLLM's workers, called through ``POST /collective_rpc``.

vLLM mixes :class:`WorkerExtension` into its worker class when started with
``--worker-extension-cls rllm_vllm_worker.WorkerExtension`` and this folder on its
``PYTHONPATH``. The module runs in the vLLM server's own interpreter, which has no rllm-core:
it imports nothing but what vLLM has.
"""

from __future__ import annotations

from typing import Any


class WorkerExtension:
    """``rllm_refresh_tied_weights``: after ``reload_weights``, redo the post-load processing
    of every layer that shares its weight with another layer.

    A model with tied input and output embeddings loads that weight once, through the layer
    the checkpoint names (the embedding). vLLM's in-place reload processes only the layers it
    loaded, so the output projection keeps what it derived from the startup weights: on the
    CPU build, the packed oneDNN copy it multiplies with. Its logprobs then come from the old
    projection of new hidden states. Processing the shared layers again, as startup did,
    derives that state from the reloaded weight.
    """

    def rllm_refresh_tied_weights(self) -> list[str]:
        """Reprocess every layer whose ``weight`` another layer also holds; returns their
        names (empty for a model without tied weights)."""
        model: Any = self.model_runner.get_model()  # type: ignore[attr-defined]
        holders: dict[int, list[tuple[str, Any]]] = {}
        for name, module in model.named_modules():
            weight = module._parameters.get("weight")
            if weight is None or getattr(module, "quant_method", None) is None:
                continue
            holders.setdefault(id(weight), []).append((name, module))
        refreshed = []
        for group in holders.values():
            if len(group) < 2:
                continue
            for name, module in group:
                module.quant_method.process_weights_after_loading(module)
                refreshed.append(name)
        return refreshed
