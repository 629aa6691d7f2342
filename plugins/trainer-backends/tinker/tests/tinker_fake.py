"""An in-process stand-in for Tinker's service, training and sampling clients.

The "model" is a bigram table: the logit of token ``b`` after token ``a`` is ``table[a, b]``;
ids at or above the table's size fold onto it (``id % VOCAB``), so datums a real tokenizer
made can be trained on.
Responses are the SDK's own types (``ForwardBackwardOutput``, ``TensorData``,
``SampleResponse``, ``SampledSequence``, ``OptimStepResponse``, ``SaveWeightsResponse``).
``forward_backward(data, "cross_entropy")`` is Tinker's built-in loss: it back-propagates
``sum(-logprobs * weights)`` over every target token into the table, as the service does with
the model, and returns each datum's target logprobs and weighted losses.
``forward_backward(data, kernel, loss_fn_config)`` with ``importance_sampling``, ``ppo`` or
``cispo`` is the service's fused kernel on the shared wire contract (``target_tokens``, the
sampler's ``logprobs``, ``advantages``; ``r = exp(logp - sampler logprobs)``, summed over every
target token): it back-propagates ``-r * A``, ``-min(r * A, clip(r) * A)`` or
``-sg(clip(r)) * A * logp`` and returns each datum's target logprobs, refusing a config other
than the kernel's clip thresholds.
``forward_backward_custom`` turns the client-side loss into per-token weights with the SDK's
own conversion, then runs that same cross-entropy pass. ``requests`` records the loss name and
the datums of every ``forward_backward`` and ``forward_backward_custom`` call;
``kernel_calls`` records ``(loss_fn, data, loss_fn_config)`` of every kernel call.

Tests of sampling during ``optim_step`` hook in with ``FakeSamplingClient.hold`` (awaited by
that client's answers before they are read) and ``FakeService.during_publish`` (called on the
trainer's thread inside ``save_weights_and_get_sampling_client``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import tinker
import torch
from rllm_core.testing.tokenizers import hf_tokenizer, smollm2_tokenizer_dir
from rllm_core.types import Datum

VOCAB = 8

CLIP_KEYS = {"clip_low_threshold", "clip_high_threshold"}


class Done:
    """A finished future with both of ``APIFuture``'s ways to read it; ``result_async``
    awaits ``hold()`` first when one is given."""

    def __init__(self, value: Any, hold: Callable[[], Awaitable[None]] | None = None) -> None:
        self.value = value
        self.hold = hold

    def result(self, timeout: float | None = None) -> Any:
        return self.value

    async def result_async(self, timeout: float | None = None) -> Any:
        if self.hold is not None:
            await self.hold()
        return self.value


def chain_table(step: int = 1, peak: float = 2.0) -> torch.Tensor:
    """Logit ``peak`` for ``(a + step) % VOCAB`` after ``a``, 0 elsewhere: greedy decoding
    walks ``a, a + step, a + 2 * step, ...``."""
    table = torch.zeros(VOCAB, VOCAB)
    for a in range(VOCAB):
        table[a, (a + step) % VOCAB] = peak
    return table


CHAIN_DATUMS = [
    # 1|0 and 2|1 follow the chain, 5|2 does not.
    Datum(
        token_ids=[0, 1, 2, 5],
        logprobs=[0.0, 0.0, -0.5, -0.7],
        advantages=[0.0, 0.0, 1.0, 1.0],
        action_mask=[False, False, True, True],
        observation_mask=[False, False, False, False],
    ),
    # 4|3 and 7|6 follow the chain, 6|4 (an observation) does not.
    Datum(
        token_ids=[3, 4, 6, 7],
        logprobs=[0.0, -0.1, 0.0, -0.2],
        advantages=[0.0, -1.0, 0.0, -1.0],
        action_mask=[False, True, False, True],
        observation_mask=[False, False, True, False],
    ),
]
"""Two datums over the chain table (:func:`chain_table`), with actions, an observation and
the sampler's logprobs."""


def bigram_logprobs(table: torch.Tensor, inputs: list[int], targets: list[int]) -> torch.Tensor:
    size = table.shape[0]
    logits = table[torch.tensor(inputs) % size]
    folded = torch.tensor(targets) % size
    return torch.log_softmax(logits, dim=-1).gather(1, folded[:, None])[:, 0]


class FakeSamplingClient:
    """Greedy decoding on a frozen copy of the table."""

    def __init__(self, table: torch.Tensor, generation: int) -> None:
        self.table = table.detach().clone()
        self.generation = generation
        self.requests: list[tuple[list[int], int, tinker.types.SamplingParams]] = []
        self.hold: Callable[[], Awaitable[None]] | None = None

    def sample(
        self,
        prompt: tinker.types.ModelInput,
        num_samples: int,
        sampling_params: tinker.types.SamplingParams,
    ) -> Done:
        ids = prompt.to_ints()
        self.requests.append((ids, num_samples, sampling_params))
        stop = set(sampling_params.stop or [])
        previous, tokens, logprobs = ids[-1], [], []
        reason = "length"
        for _ in range(sampling_params.max_tokens):
            row = torch.log_softmax(self.table[previous], dim=-1)
            token = int(row.argmax())
            tokens.append(token)
            logprobs.append(float(row[token]))
            previous = token
            if token in stop:
                reason = "stop"
                break
        sequence = tinker.types.SampledSequence(
            stop_reason=reason,
            sequence_id=f"seq-{self.generation}-{len(self.requests)}",
            tokens_np=np.array(tokens, dtype=np.int32),
            logprobs_np=np.array(logprobs, dtype=np.float32),
        )
        return Done(tinker.types.SampleResponse(sequences=[sequence]), self.hold)


class FakeTrainingClient:
    def __init__(self, service: FakeService, table: torch.Tensor) -> None:
        self.service = service
        self.table = table.detach().clone().requires_grad_(True)
        self.optim_params: list[tinker.types.AdamParams] = []
        self.saved_names: list[tuple[str, int | None, bool]] = []
        self.requests: list[tuple[str, list[tinker.types.Datum]]] = []
        self.kernel_calls: list[tuple[str, list[tinker.types.Datum], dict[str, Any] | None]] = []

    def get_tokenizer(self) -> Any:
        """SmolLM2's tokenizer stands for the model's (the bigram table folds every id)."""
        return hf_tokenizer(smollm2_tokenizer_dir())

    def _logprobs(self, datum: tinker.types.Datum) -> torch.Tensor:
        targets = datum.loss_fn_inputs["target_tokens"].to_torch().tolist()
        return bigram_logprobs(self.table, datum.model_input.to_ints(), targets)

    def _cross_entropy(self, data: list[tinker.types.Datum]) -> tinker.types.ForwardBackwardOutput:
        outputs, total = [], 0.0
        for datum in data:
            logprobs = self._logprobs(datum)
            losses = -(logprobs * datum.loss_fn_inputs["weights"].to_torch())
            losses.sum().backward()
            total += float(losses.detach().sum())
            outputs.append(
                {
                    "logprobs": tinker.types.TensorData.from_torch(logprobs.detach()),
                    "elementwise_loss": tinker.types.TensorData.from_torch(losses.detach()),
                }
            )
        return tinker.types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={"loss:sum": total}
        )

    def _kernel(
        self, data: list[tinker.types.Datum], loss_fn: str, config: dict[str, Any] | None
    ) -> tinker.types.ForwardBackwardOutput:
        expected = set() if loss_fn == "importance_sampling" else CLIP_KEYS
        if set(config or {}) != expected:
            raise ValueError(f"the {loss_fn!r} kernel takes {sorted(expected)}, not {config!r}")
        outputs, total = [], 0.0
        for datum in data:
            inputs = datum.loss_fn_inputs
            logprobs = self._logprobs(datum)
            ratio = torch.exp(logprobs - inputs["logprobs"].to_torch())
            advantages = inputs["advantages"].to_torch()
            if loss_fn == "importance_sampling":
                losses = -ratio * advantages
            else:
                low, high = config["clip_low_threshold"], config["clip_high_threshold"]
                clipped = ratio.clamp(low, high)
                if loss_fn == "ppo":
                    losses = -torch.minimum(ratio * advantages, clipped * advantages)
                else:
                    losses = -clipped.detach() * advantages * logprobs
            losses.sum().backward()
            total += float(losses.detach().sum())
            outputs.append({"logprobs": tinker.types.TensorData.from_torch(logprobs.detach())})
        return tinker.types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={"loss:sum": total}
        )

    def forward_backward(
        self,
        data: list[tinker.types.Datum],
        loss_fn: str,
        loss_fn_config: dict[str, Any] | None = None,
    ) -> Done:
        if loss_fn in ("importance_sampling", "ppo", "cispo"):
            self.requests.append((loss_fn, list(data)))
            self.kernel_calls.append((loss_fn, list(data), loss_fn_config))
            return Done(self._kernel(data, loss_fn, loss_fn_config))
        if loss_fn != "cross_entropy" or loss_fn_config is not None:
            raise NotImplementedError(f"the fake serves no {loss_fn!r} loss")
        self.requests.append((loss_fn, list(data)))
        return Done(self._cross_entropy(data))

    def forward(
        self,
        data: list[tinker.types.Datum],
        loss_fn: str,
        loss_fn_config: dict[str, Any] | None = None,
    ) -> Done:
        """The cross-entropy forward pass alone: logprobs, no gradient."""
        if loss_fn != "cross_entropy" or loss_fn_config is not None:
            raise NotImplementedError(f"the fake serves cross_entropy only, not {loss_fn!r}")
        self.requests.append(("forward", list(data)))
        outputs = [
            {"logprobs": tinker.types.TensorData.from_torch(self._logprobs(d).detach())}
            for d in data
        ]
        return Done(
            tinker.types.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={}
            )
        )

    def forward_backward_custom(self, data: list[tinker.types.Datum], loss_fn: Any) -> Done:
        self.requests.append(("custom", list(data)))
        outputs = [
            {"logprobs": tinker.types.TensorData.from_torch(self._logprobs(d).detach())}
            for d in data
        ]
        forward = tinker.types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs
        )
        custom = tinker.TrainingClient._compute_custom_loss(data, loss_fn, forward)
        self._cross_entropy(custom.data)
        metrics = {**custom.metrics, "loss:sum": custom.loss_sum}
        return Done(
            tinker.types.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics=metrics
            )
        )

    def optim_step(self, params: tinker.types.AdamParams) -> Done:
        """Plain SGD with the given learning rate, so tests can predict the new table."""
        self.optim_params.append(params)
        grad = self.table.grad
        norm = float(grad.norm())
        with torch.no_grad():
            self.table -= params.learning_rate * grad
        self.table.grad = None
        return Done(tinker.types.OptimStepResponse(metrics={"grad_norm": norm}))

    def save_weights_and_get_sampling_client(self) -> Done:
        if self.service.during_publish is not None:
            self.service.during_publish()
        self.service.generation += 1
        return Done(FakeSamplingClient(self.table, self.service.generation))

    def save_state(
        self, name: str, ttl_seconds: int | None = None, overwrite: bool = False
    ) -> Done:
        self.saved_names.append((name, ttl_seconds, overwrite))
        path = f"tinker://fake-run/weights/{name}"
        self.service.store[path] = self.table.detach().clone()
        return Done(tinker.types.SaveWeightsResponse(path=path))


class FakeService:
    """Stands in for ``tinker.ServiceClient``."""

    def __init__(self, table: torch.Tensor | None = None) -> None:
        self.initial = chain_table() if table is None else table
        self.created: list[dict[str, Any]] = []
        self.loaded: list[str] = []
        self.store: dict[str, torch.Tensor] = {}
        self.generation = 0
        self.closed = False
        self.training: FakeTrainingClient | None = None
        self.during_publish: Callable[[], None] | None = None

    def create_lora_training_client(self, **kwargs: Any) -> Done:
        self.created.append(kwargs)
        self.training = FakeTrainingClient(self, self.initial)
        return Done(self.training)

    def create_training_client_from_state_with_optimizer(self, path: str) -> Done:
        self.loaded.append(path)
        self.training = FakeTrainingClient(self, self.store[path])
        return Done(self.training)

    def close(self) -> None:
        self.closed = True
