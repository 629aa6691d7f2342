"""A fake of the Fireworks training service that answers with the SDK's own types.

The trainer's "model" gives target token ``t`` the logprob ``-0.1 * t``. ``forward_backward_custom``
does what the SDK does: hands the loss one logprob tensor per datum, backpropagates, and keeps
the surrogate weights (``-dloss/dlogprob``) it would send to the trainer.
``forward_backward(data, "cross_entropy")`` is the trainer's built-in loss
``sum(-logprob * weight)``: it records the loss name and the datums in ``cross_entropy``, and
answers each datum's target logprobs with the SDK client's metrics (``loss:sum``,
``response_tokens``). ``forward_backward(data, kernel, loss_fn_config)`` with one of the
trainer's policy kernels (``importance_sampling``, ``ppo``, ``cispo``) checks each datum carries
what the kernel reads (``target_tokens``, ``logprobs``, ``advantages``), records the call in
``native`` and answers each datum's target logprobs.

Each sampling client has a ``deployment_sampler``, a :class:`FakeDeploymentSampler` (the SDK's
``DeploymentSampler`` with its completions request replaced) that records every
``sample_with_prompt_tokens`` call with its ``prompt_cache_key`` and answers from the same
replies as ``sample_async``. With ``FakeTraining.sdk_sampling`` set, the sampling clients are
the SDK's own ``FiretitanSamplingClient`` over a :class:`FakeDeploymentSampler`, so a request
without a session takes the SDK's ``sample_async`` path to the deployment.

Tests of sampling during ``optim_step`` hook in with ``FakeTraining.hold_sample`` (awaited by
each sampling request before it answers), ``during_save`` and ``during_hot_load`` (called on
the trainer's thread inside ``save_weights_for_sampler`` and ``create_sampling_client``);
``running`` counts the sampling requests under way and ``hot_loads`` records, for each
hot-load, the snapshot and how many requests were running then.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from fireworks.training.sdk import (
    FiretitanSamplingClient,
    SaveSamplerResult,
    validate_output_model_id,
)
from fireworks.training.sdk import types as fw
from fireworks.training.sdk.sampling import DeploymentSampler, SampledCompletion
from rllm_core.testing.tokenizers import hf_tokenizer, smollm2_tokenizer_dir
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig

CONFIG = FireworksBackendConfig(
    model="accounts/fireworks/models/qwen3-8b", lora_rank=8, retry_backoff_s=0.0
)
"""The config of the backends the offline tests build over :class:`FakeService`."""

SESSION = "a1b2c3d4"
"""The session suffix the fake trainer adds to snapshot names, as the SDK does."""

NATIVE_INPUTS = {"target_tokens", "logprobs", "advantages"}
"""The inputs the trainer's policy kernels read from each datum."""


def logprob_of(token: int) -> float:
    return -0.1 * token


class Done:
    """An already-finished SDK future."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.timeouts: list[float | None] = []

    def result(self, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        return self.value


@dataclass
class FakeSampling:
    path: str
    replies: list[fw.SampleResponse]
    training: FakeTraining | None = None
    requests: list[tuple[list[int], int, fw.SamplingParams]] = field(default_factory=list)
    closed: bool = False
    deployment_sampler: FakeDeploymentSampler = field(init=False)

    def __post_init__(self) -> None:
        self.deployment_sampler = FakeDeploymentSampler(self.path, self.replies, self.training)

    async def sample_async(
        self, prompt: fw.ModelInput, num_samples: int, sampling_params: fw.SamplingParams
    ) -> fw.SampleResponse:
        self.requests.append((prompt.to_ints(), num_samples, sampling_params))
        training = self.training
        if training is None:
            return self.replies.pop(0)
        training.running += 1
        try:
            if training.hold_sample is not None:
                await training.hold_sample()
            return self.replies.pop(0)
        finally:
            training.running -= 1

    def close(self) -> None:
        self.closed = True


class FakeDeploymentSampler(DeploymentSampler):
    """The SDK's deployment sampler answering from ``replies`` instead of a deployment: a
    queued ``SampleResponse`` becomes the ``SampledCompletion`` the deployment would return
    (completion-aligned logprobs), a queued ``SampledCompletion`` is returned as it is. Each
    call is recorded in ``calls``; with ``training`` set, calls count in its ``running`` and
    await its ``hold_sample``."""

    def __init__(
        self,
        model: str,
        replies: list[fw.SampleResponse | SampledCompletion],
        training: FakeTraining | None = None,
    ) -> None:
        super().__init__(inference_url="https://deployment.invalid", model=model, api_key="fake")
        self.replies = replies
        self.training = training
        self.calls: list[dict[str, Any]] = []

    async def sample_with_prompt_tokens(  # type: ignore[override]
        self,
        prompt_token_ids: list[int],
        n: int = 1,
        max_tokens: int = 1024,
        temperature: float = 1.0,
        max_seq_len: int | None = None,
        stop: list[str] | list[int] | None = None,
        prompt_cache_key: str | None = None,
        additional_headers_snapshot: Any = None,
        **kwargs: Any,
    ) -> list[SampledCompletion]:
        self.calls.append(
            {
                "prompt_token_ids": list(prompt_token_ids),
                "n": n,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "stop": stop,
                "prompt_cache_key": prompt_cache_key,
                **kwargs,
            }
        )
        training = self.training
        if training is not None:
            training.running += 1
        try:
            if training is not None and training.hold_sample is not None:
                await training.hold_sample()
            answer = self.replies.pop(0)
        finally:
            if training is not None:
                training.running -= 1
        if isinstance(answer, SampledCompletion):
            return [answer]
        return [completion(prompt_token_ids, answer)]


def completion(prompt: list[int], response: fw.SampleResponse) -> SampledCompletion:
    """The deployment's completion for ``prompt`` carrying ``response``'s one sequence."""
    (sequence,) = response.sequences
    tokens = [int(t) for t in sequence.tokens]
    logprobs = sequence.logprobs
    return SampledCompletion(
        text="",
        full_tokens=[*prompt, *tokens],
        prompt_len=len(prompt),
        finish_reason=sequence.stop_reason,
        completion_len=len(tokens),
        sampling_logprobs=None if logprobs is None else list(logprobs),
    )


@dataclass
class FakeTraining:
    replies: list[fw.SampleResponse] = field(default_factory=list)
    sent_weights: list[list[list[float]]] = field(default_factory=list)
    sent_inputs: list[list[tuple[list[int], list[int]]]] = field(default_factory=list)
    cross_entropy: list[tuple[str, list[fw.Datum]]] = field(default_factory=list)
    native: list[tuple[list[fw.Datum], str, dict[str, Any] | None]] = field(default_factory=list)
    custom_calls: int = 0
    forwards: list[list[fw.Datum]] = field(default_factory=list)
    adam: list[fw.AdamParams] = field(default_factory=list)
    saved_for_sampler: list[str] = field(default_factory=list)
    final_saves: list[tuple[str, str | None, int]] = field(default_factory=list)
    samplers: list[FakeSampling] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    loaded: list[str] = field(default_factory=list)
    steps: int = 0
    running: int = 0
    hot_loads: list[tuple[str, int]] = field(default_factory=list)
    hold_sample: Callable[[], Awaitable[None]] | None = None
    during_save: Callable[[], None] | None = None
    during_hot_load: Callable[[], None] | None = None
    sdk_sampling: bool = False

    def forward_backward_custom(self, data: list[fw.Datum], loss_fn: Any) -> Done:
        inputs = [
            (d.model_input.to_ints(), d.loss_fn_inputs["target_tokens"].tolist()) for d in data
        ]
        logprobs = [
            torch.tensor([logprob_of(t) for t in targets], requires_grad=True)
            for _, targets in inputs
        ]
        loss, metrics = loss_fn(data, logprobs)
        loss.backward()
        self.custom_calls += 1
        self.sent_inputs.append(inputs)
        self.sent_weights.append([(-lp.grad).tolist() for lp in logprobs])
        outputs = [
            {"logprobs": fw.TensorData(data=lp.detach().tolist(), dtype="float32")}
            for lp in logprobs
        ]
        return Done(
            fw.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord",
                loss_fn_outputs=outputs,
                metrics={**metrics, "loss:sum": 1.5},
            )
        )

    def forward_backward(
        self, data: list[fw.Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None = None
    ) -> Done:
        if loss_fn in ("importance_sampling", "ppo", "cispo"):
            return self._native(data, loss_fn, loss_fn_config)
        if loss_fn != "cross_entropy" or loss_fn_config is not None:
            raise NotImplementedError(f"the fake serves cross_entropy only, not {loss_fn!r}")
        self.cross_entropy.append((loss_fn, list(data)))
        outputs, total, weighted = [], 0.0, 0
        for datum in data:
            targets = datum.loss_fn_inputs["target_tokens"].tolist()
            weights = datum.loss_fn_inputs["weights"].tolist()
            logprobs = [logprob_of(t) for t in targets]
            total += sum(-lp * w for lp, w in zip(logprobs, weights, strict=True))
            weighted += sum(1 for w in weights if w != 0)
            outputs.append({"logprobs": fw.TensorData(data=logprobs, dtype="float32")})
        return Done(
            fw.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord",
                loss_fn_outputs=outputs,
                metrics={"loss:sum": total, "response_tokens": float(weighted)},
            )
        )

    def _native(
        self, data: list[fw.Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> Done:
        for index, datum in enumerate(data):
            if set(datum.loss_fn_inputs) != NATIVE_INPUTS:
                raise ValueError(
                    f"datum {index} of a {loss_fn!r} request has inputs"
                    f" {sorted(datum.loss_fn_inputs)}, expected {sorted(NATIVE_INPUTS)}"
                )
        self.native.append((list(data), loss_fn, loss_fn_config))
        outputs = [
            {
                "logprobs": fw.TensorData(
                    data=[logprob_of(t) for t in d.loss_fn_inputs["target_tokens"].tolist()],
                    dtype="float32",
                )
            }
            for d in data
        ]
        return Done(
            fw.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord",
                loss_fn_outputs=outputs,
                metrics={"loss:sum": 2.5},
            )
        )

    def forward(
        self, data: list[fw.Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None = None
    ) -> Done:
        """The cross-entropy forward pass alone: logprobs, recorded in ``forwards``."""
        if loss_fn != "cross_entropy" or loss_fn_config is not None:
            raise NotImplementedError(f"the fake serves cross_entropy only, not {loss_fn!r}")
        self.forwards.append(list(data))
        outputs = [
            {
                "logprobs": fw.TensorData(
                    data=[logprob_of(t) for t in d.loss_fn_inputs["target_tokens"].tolist()],
                    dtype="float32",
                )
            }
            for d in data
        ]
        return Done(
            fw.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={}
            )
        )

    def optim_step(self, adam_params: fw.AdamParams) -> Done:
        self.adam.append(adam_params)
        self.steps += 1
        return Done(fw.OptimStepResponse(metrics={"grad_norm": 0.25}))

    def save_weights_for_sampler(self, name: str) -> Done:
        self.saved_for_sampler.append(name)
        if self.during_save is not None:
            self.during_save()
        return Done(fw.SaveWeightsForSamplerResponse(path=f"snapshots/{name}"))

    def save_weights_for_sampler_ext(
        self, name: str, checkpoint_type: str | None = None
    ) -> SaveSamplerResult:
        """As the SDK: the snapshot name carries the session suffix, the answer is no future."""
        snapshot = f"{name}-{SESSION}"
        self.saved_for_sampler.append(name)
        self.final_saves.append((snapshot, checkpoint_type, self.steps))
        return SaveSamplerResult(path=f"snapshots/{snapshot}", snapshot_name=snapshot)

    def create_sampling_client(self, model_path: str) -> Any:
        self.hot_loads.append((model_path, self.running))
        if self.during_hot_load is not None:
            self.during_hot_load()
        if self.sdk_sampling:
            return FiretitanSamplingClient(FakeDeploymentSampler(model_path, self.replies))
        sampling = FakeSampling(path=model_path, replies=self.replies, training=self)
        self.samplers.append(sampling)
        return sampling

    def get_tokenizer(self) -> Any:
        """SmolLM2's tokenizer (49152 ids) stands for the trained model's."""
        return hf_tokenizer(smollm2_tokenizer_dir())

    def save_state(self, name: str) -> Done:
        self.states[f"dcp/{name}"] = self.steps
        return Done(fw.SaveWeightsResponse(path=f"dcp/{name}"))

    def load_state_with_optimizer(self, path: str) -> Done:
        self.loaded.append(path)
        self.steps = self.states[path]
        return Done(None)


@dataclass
class FakeService:
    training: FakeTraining = field(default_factory=FakeTraining)
    created: list[dict[str, Any]] = field(default_factory=list)
    promoted: list[tuple[str, str, str, str]] = field(default_factory=list)
    models: set[str] = field(default_factory=set)
    closed: bool = False
    trainer_job_id: str = "job-7f3a"

    def promote_checkpoint(
        self, job_id: str, checkpoint_id: str, output_model_id: str, base_model: str
    ) -> dict[str, Any]:
        """The SDK's checks of the id, then the model the account holds from now on; an id
        taken already fails as the gateway's 409 does."""
        if self.closed:
            raise RuntimeError("the trainer job is torn down")
        errors = validate_output_model_id(output_model_id)
        if errors:
            raise ValueError("\n\n".join(errors))
        if output_model_id in self.models:
            raise RuntimeError(f"Failed to promote checkpoint {checkpoint_id!r}: 409 exists")
        self.models.add(output_model_id)
        self.promoted.append((job_id, checkpoint_id, output_model_id, base_model))
        return {
            "name": f"accounts/acme/models/{output_model_id}",
            "state": "READY",
            "kind": "HF_PEFT_ADDON",
        }

    def create_training_client(self, **kwargs: Any) -> FakeTraining:
        self.created.append(kwargs)
        return self.training

    def close(self) -> None:
        self.closed = True


def reply(tokens: list[int], logprobs: list[float] | None, stop: str = "stop") -> fw.SampleResponse:
    return fw.SampleResponse(
        sequences=[
            fw.SampledSequence(
                stop_reason=stop, tokens_np=None, _tokens_list=tokens, _logprobs_list=logprobs
            )
        ],
    )
