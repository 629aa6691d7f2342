"""The Fireworks trainer backend: the policy lives on a Fireworks trainer job, the sampler on
a deployment that hot-loads each new version of the weights."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from fireworks.training.sdk import types as fw
from rllm_core.algorithms.native_losses import LossRoute, route_objective
from rllm_core.algorithms.objective import Objective
from rllm_core.errors import PlanError, PlanIssue
from rllm_core.kit.managed import ServiceCalls, service_metrics, supervised
from rllm_core.kit.token_hygiene import VocabBound, screen
from rllm_core.types import Datum

from rllm_trainer_backend_fireworks.gate import HotLoadGate
from rllm_trainer_backend_fireworks.losses import StepLoss, to_sdk_datum
from rllm_trainer_backend_fireworks.native import (
    available_kernels,
    native_datums,
    replayed_metrics,
)
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig
from rllm_trainer_backend_fireworks.sampler import FireworksSampler
from rllm_trainer_backend_fireworks.transient import is_transient

__all__ = ["STATE_FILE", "FireworksBackend"]

log = logging.getLogger(__name__)

STATE_FILE = "fireworks-state.json"
"""The file ``save_state`` writes into its folder: the trainer checkpoint's remote path and
the backend's counters."""


class FireworksBackend:
    """A :class:`~rllm_core.ports.TrainerBackend` over the Fireworks training API, a
    :class:`~rllm_core.ports.SupervisedTrainer` on the trainer's built-in cross-entropy loss,
    and a :class:`~rllm_core.ports.LogprobScorer` (a forward pass of that loss; the RL losses
    still take the sampler's logprobs as proximal, see the spec's ``proximal_modes``).

    ``service`` is a ``FiretitanServiceClient`` (or an object with the same
    ``create_training_client`` method); unset, one is created from the config, which provisions
    a trainer job and a hot-load deployment on Fireworks.

    ``loss_route(objective)`` chooses where the objective runs (``[trainer].loss_path``, see
    :func:`~rllm_core.algorithms.native_losses.route_objective`): in one of the trainer's own
    kernels (``importance_sampling``, ``ppo``, ``cispo``; one fused pass, the aggregation folded
    into the advantages, see :mod:`rllm_trainer_backend_fireworks.native`) when the policy loss has
    one and no auxiliary loss or rollout correction needs the current logprobs here; otherwise
    client-side on the logprobs the trainer returns (``forward_backward_custom``, two passes).
    Either way a loss that reduces through ``ctx.aggregate`` is normalized over the whole call,
    the trainer adds no normalization of its own, and the metrics are the same: on the native
    path the objective is evaluated without gradient on the logprobs the kernel returns.

    Before each step the datums the trainer would fail on (token ids outside the vocabulary:
    ``vocab_size``, else the tokenizer's length; datums without a sampled token) are dropped
    with a warning naming their session (see :mod:`rllm_core.kit.token_hygiene`). When a
    step's calls drop every datum, nothing is sent: its ``optim_step`` neither steps nor
    publishes, and ``weight_version`` stays.

    After each ``optim_step`` the new weights are saved for sampling while the deployment
    keeps serving the previous ones; then the deployment hot-loads them, and the new sampling
    client and ``weight_version`` are installed together before ``optim_step`` returns. The
    deployment serves one snapshot at a time and a request does not name it, so the hot-load
    waits for the sampling requests already running (they finish on, and report, the version
    they started with) and holds new ones back until the new version is in place (see
    :class:`~rllm_trainer_backend_fireworks.gate.HotLoadGate`). Sampling may thus run on the
    event loop while ``optim_step`` runs on another thread.

    ``save_state(path)`` saves a trainer checkpoint (weights and optimizer) on Fireworks and
    writes its remote path with the counters to ``path/fireworks-state.json``; the folder is
    only a pointer, and loading it needs the same Fireworks account.

    Every trainer call and sampling request that fails transiently (see
    :mod:`rllm_trainer_backend_fireworks.transient`) is sent again, up to ``retries`` times
    with jittered exponential backoff; other errors fail at once. ``forward_backward`` reports
    its retries as ``fireworks/retries``; ``optim_step`` reports its own (publishing included)
    as ``fireworks/retries`` and the sampler's since the previous step as
    ``fireworks/sampler_retries``.

    With ``promote_final``, :meth:`close` first promotes the final weights (see
    :meth:`promote_final`) when at least one optimizer step was taken, then tears the job
    down; a failed promotion is logged as an error naming what to do and does not keep the
    job up.
    """

    def __init__(self, config: FireworksBackendConfig, *, service: Any = None) -> None:
        if config.logprob_temperature != 1.0:
            raise PlanError(
                [
                    PlanIssue(
                        path="plan",
                        section="trainer",
                        key="logprob_temperature",
                        value=config.logprob_temperature,
                        message=(
                            f"the Fireworks trainer computes logprobs at temperature 1 only, not"
                            f" {config.logprob_temperature}"
                        ),
                        hint="set logprob_temperature = 1.0 and [sampling].temperature = 1.0",
                    )
                ]
            )
        self.config = config
        self._service = service if service is not None else _connect(config)
        self.calls = ServiceCalls("Fireworks", config, transient=is_transient)
        self._training = self._service.create_training_client(
            base_model=config.model,
            lora_rank=config.lora_rank,
            seed=config.seed,
            lora_alpha=config.lora_alpha,
        )
        self._vocab = VocabBound(
            config.vocab_size, config.tokenizer, lambda: self._training.get_tokenizer(), "Fireworks"
        )
        self._gate = HotLoadGate()
        self._steps = 0
        self._publishes = 0
        self._saves = 0
        self._sampler_path = ""
        self._closed = False
        self._route: tuple[Objective, LossRoute] | None = None
        self.promoted_model: str | None = None
        # What the forward_backward calls since the last optim_step did: None (no call),
        # "skip" (every call dropped all its datums) or "train".
        self._pending: str | None = None
        self._publish(0, [])

    @property
    def weight_version(self) -> int:
        return self._gate.version

    @property
    def optimizer_steps(self) -> int:
        return self._steps

    @property
    def sampling_client(self) -> Any:
        """The SDK sampling client bound to the newest published weights."""
        self._check_open()
        return self._gate.client

    def sampling(self) -> AbstractAsyncContextManager[tuple[Any, int]]:
        """Hold the newest sampling client and its weight version for one request: the
        deployment does not switch weights until the request is done."""
        return self._gate.request()

    @property
    def sampler_path(self) -> str:
        """The Fireworks snapshot the deployment serves now."""
        return self._sampler_path

    def sampler(self) -> FireworksSampler:
        return FireworksSampler(self)

    def loss_route(self, objective: Objective) -> LossRoute:
        """The path ``objective`` trains on (see the class docstring); the same for every call
        with the same objective. Calls no service. Raises
        :class:`~rllm_core.algorithms.native_losses.NativeLossError` when ``loss_path = "native"``
        and the objective has no Fireworks kernel."""
        if self._route is None or self._route[0] is not objective:
            route = route_objective(
                objective,
                service="fireworks",
                available=available_kernels(),
                requested=self.config.loss_path,
            )
            self._route = (objective, route)
        return self._route[1]

    def forward_backward(
        self, datums: Sequence[Datum], objective: Objective
    ) -> Mapping[str, float]:
        """One step's gradient over ``datums`` on the trainer, on :meth:`loss_route`'s path:
        one fused pass in a native kernel, or a forward and a backward pass around the
        objective evaluated here.

        Returns the objective's metrics, ``tokens`` and ``sequences``, ``fireworks/native``
        (1.0 on the native path), the dropped datums' counts (``fireworks/dropped_*``) and the
        trainer's own figures prefixed ``fireworks/``. When every datum is dropped, nothing is
        sent and the metrics are the counts with ``fireworks/skipped_step`` = 1.0.
        """
        self._check_open()
        if not datums:
            raise ValueError("forward_backward got no datums; pass at least one datum to train")
        for index, datum in enumerate(datums):
            if len(datum.token_ids) < 2:
                raise ValueError(
                    f"datum {index} has {len(datum.token_ids)} token(s); a datum needs at least"
                    f" 2 tokens to train (a prompt and a completion): {datum.token_ids}"
                )
        route = self.loss_route(objective)
        screened = screen(datums, vocab_size=self._vocab(), service="Fireworks")
        hygiene = screened.metrics("fireworks")
        if not screened.kept:
            if self._pending is None:
                self._pending = "skip"
            return {**hygiene, "fireworks/skipped_step": 1.0, "tokens": 0.0, "sequences": 0.0}
        kept = screened.kept
        step_loss = StepLoss(kept, objective)
        retries: list[int] = []
        if route.path == "native":
            assert route.kernel is not None
            sent = native_datums(kept, objective)
            kernel, config = route.kernel, dict(route.config) or None
            output = self.calls.call(
                lambda: self._training.forward_backward(sent, kernel, config),
                "forward_backward",
                retries,
            )
            metrics = replayed_metrics(step_loss, output.loss_fn_outputs)
        else:
            sdk_datums = [to_sdk_datum(d) for d in kept]
            output = self.calls.call(
                lambda: self._training.forward_backward_custom(sdk_datums, step_loss),
                "forward_backward",
                retries,
            )
            metrics = dict(step_loss.metrics)
        self._pending = "train"
        metrics.update(service_metrics(output.metrics, "fireworks", besides=metrics))
        metrics["fireworks/native"] = 1.0 if route.path == "native" else 0.0
        metrics["fireworks/retries"] = float(len(retries))
        return metrics | hygiene

    def forward_backward_supervised(self, datums: Sequence[Datum]) -> dict[str, float]:
        """Add the gradient of the mean negative log-likelihood of ``datums``' trained tokens
        (``action_mask``) on the trainer's built-in ``cross_entropy`` loss: one forward and
        backward pass, no logprobs sent back and forth (see
        :mod:`rllm_core.kit.managed.supervised` for the weights that make the trainer's sum
        that mean; ``optim_step`` sends no ``grad_accumulation_normalization``, so the trainer
        adds none).

        Invalid datums raise ``ValueError`` before anything is sent. Returns ``nll`` (the mean,
        from the logprobs the trainer returns), ``tokens`` (trained tokens), ``sequences`` and
        the trainer's own figures prefixed ``fireworks/``.
        """
        self._check_open()
        metrics = supervised.forward_backward_supervised(
            self.calls, self._training, datums, to_sdk_datum, "fireworks"
        )
        self._pending = "train"
        return metrics

    def compute_logprobs(self, datums: Sequence[Datum]) -> list[list[float]]:
        """Each datum's per-token logprobs under the current weights (0.0 at position 0), at
        temperature 1, from a forward pass of the trainer's ``cross_entropy`` loss: no
        gradient, nothing of the training run changes. ``rllm-core sft`` scores its eval split
        with it."""
        self._check_open()
        return supervised.compute_logprobs(self.calls, self._training, datums, to_sdk_datum)

    def optim_step(self) -> dict[str, float]:
        """Apply the accumulated gradients with Adam, then publish the new weights to the
        sampling deployment (its hot-load waits for the sampling requests that run). Returns
        ``learning_rate``, ``step``, ``fireworks/skipped_step`` (0.0) and the trainer's figures
        prefixed ``fireworks/``.

        When every ``forward_backward`` since the previous step dropped all its datums, there
        is no gradient: nothing is sent or published, ``step`` and ``weight_version`` stay,
        and the metrics carry ``fireworks/skipped_step`` = 1.0."""
        self._check_open()
        pending, self._pending = self._pending, None
        if pending == "skip":
            return {
                "learning_rate": self.config.learning_rate,
                "step": float(self._steps),
                "fireworks/skipped_step": 1.0,
                "fireworks/retries": 0.0,
                "fireworks/sampler_retries": float(self.calls.take_sampler_retries()),
            }
        params = fw.AdamParams(**self.config.adam_params())
        retries: list[int] = []
        response = self.calls.call(lambda: self._training.optim_step(params), "optim_step", retries)
        self._steps += 1
        self._publish(self.weight_version + 1, retries)
        metrics = {
            "learning_rate": self.config.learning_rate,
            "step": float(self._steps),
            "fireworks/skipped_step": 0.0,
        }
        metrics.update(service_metrics(response.metrics, "fireworks"))
        metrics["fireworks/retries"] = float(len(retries))
        metrics["fireworks/sampler_retries"] = float(self.calls.take_sampler_retries())
        return metrics

    def save_state(self, path: str) -> None:
        self._check_open()
        self._saves += 1
        name = f"rllm-state-step{self._steps}-{self._saves}"
        checkpoint = self.calls.call(
            lambda: self._training.save_state(name), "save_state", idempotent=True
        ).path
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            "checkpoint": checkpoint,
            "model": self.config.model,
            "lora_rank": self.config.lora_rank,
            "weight_version": self.weight_version,
            "optimizer_steps": self._steps,
        }
        tmp = folder / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, folder / STATE_FILE)

    def load_state(self, path: str) -> None:
        self._check_open()
        file = Path(path) / STATE_FILE
        if not file.is_file():
            raise FileNotFoundError(
                f"{file} does not exist; pass a folder written by the fireworks backend's"
                " save_state"
            )
        state = json.loads(file.read_text())
        if "base_model" in state:
            # Folders saved before the key was renamed name the model base_model.
            state["model"] = state.pop("base_model")
        for key in ("model", "lora_rank"):
            if state[key] != getattr(self.config, key):
                raise ValueError(
                    f"{file} was saved with {key} {state[key]!r} but this backend trains"
                    f" {getattr(self.config, key)!r}; load it with the same [trainer] settings"
                )
        self.calls.call(
            lambda: self._training.load_state_with_optimizer(state["checkpoint"]),
            "load_state",
            idempotent=True,
        )
        self._steps = int(state["optimizer_steps"])
        self._pending = None
        self._publish(int(state["weight_version"]), [])

    def promote_final(self) -> str:
        """Save the current weights as a sampler checkpoint of type ``base`` (the whole
        adapter, or every weight with ``lora_rank = 0``) and promote it to the Fireworks model
        ``promoted_model_id`` (unset: ``rllm-<trainer job id>-step<N>``) with ``model`` as its
        base; returns the model's resource name, also kept in :attr:`promoted_model` and
        logged. The save is retried like any publish; the promotion is not sent twice."""
        self._check_open()
        step = self._steps
        saved = self.calls.call(
            lambda: _done(
                self._training.save_weights_for_sampler_ext(
                    f"rllm-final-step{step}", checkpoint_type="base"
                )
            ),
            "saving the final weights",
            idempotent=True,
        )
        job = self._service.trainer_job_id
        model_id = self.config.promoted_model_id or _model_id(job, step)
        model = self.calls.call(
            lambda: _done(
                self._service.promote_checkpoint(
                    job, saved.snapshot_name, model_id, self.config.model
                )
            ),
            "promoting the final weights",
        )
        name = str(model.get("name") or model_id)
        self.promoted_model = name
        log.warning(
            "promoted the final weights (step %d, checkpoint %s of trainer job %s) to the"
            " Fireworks model %s; it stays on the account until deleted",
            step,
            saved.snapshot_name,
            job,
            name,
        )
        return name

    def close(self) -> None:
        """Promote the final weights when ``promote_final`` asks (see the class docstring),
        then close the sampling client and the service, which tears down the trainer job and
        the deployment the backend created."""
        if self._closed:
            return
        if self.config.promote_final and self._steps > 0:
            try:
                self.promote_final()
            except Exception as exc:
                log.error(
                    "promote_final: promoting the final weights (step %d) failed: %s: %s; the"
                    " trainer job is torn down now, so resume from the last checkpoint and"
                    " promote it again, or set promoted_model_id to an id not taken",
                    self._steps,
                    type(exc).__name__,
                    exc,
                )
        self._closed = True
        for resource in (self._gate.client, self._service):
            closer = getattr(resource, "close", None)
            if callable(closer):
                closer()

    def _publish(self, version: int, retries: list[int]) -> None:
        """Save the current weights for sampling, then, once no sampling request runs, bind a
        sampling client to them as ``version``: the SDK returns that client once the
        deployment serves the snapshot. Retries are appended to ``retries``."""
        self._publishes += 1
        name = f"rllm-weights-v{version}-{self._publishes}"
        saved = self.calls.call(
            lambda: self._training.save_weights_for_sampler(name),
            "publishing weights",
            retries,
            idempotent=True,
        )
        previous = self._gate.switch(
            lambda: self._training.create_sampling_client(saved.path),
            version,
            self.config.request_timeout_s,
        )
        self._sampler_path = saved.path
        if previous is not None and previous is not self._gate.client:
            closer = getattr(previous, "close", None)
            if callable(closer):
                closer()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Fireworks backend is closed; build a new one from the plan")


def _done(value: Any) -> Future[Any]:
    """A finished future of ``value``: the SDK answers these calls at once, not by future."""
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def _model_id(job: str, step: int) -> str:
    """``rllm-<job>-step<N>`` in the characters a Fireworks model id allows, at most 63."""
    suffix = f"-step{step}"
    stem = re.sub(r"[^a-z0-9-]+", "-", f"rllm-{job.rsplit('/', 1)[-1].lower()}").strip("-")
    return stem[: 63 - len(suffix)].rstrip("-") + suffix


def _connect(config: FireworksBackendConfig) -> Any:
    api_key = os.environ.get(config.api_key_env, "")
    if not api_key:
        raise PlanError(
            [
                PlanIssue(
                    path="plan",
                    section="trainer",
                    key="api_key_env",
                    value=config.api_key_env,
                    message=f"the Fireworks trainer needs an API key and ${config.api_key_env}"
                    " is not set",
                    hint=f"export {config.api_key_env}=<a training-scoped Fireworks API key>",
                )
            ]
        )
    from fireworks.training.sdk import FiretitanServiceClient

    managed: dict[str, Any] = {
        "base_model": config.model,
        "lora_rank": config.lora_rank,
        "lora_alpha": config.lora_alpha if config.lora_rank else None,
        "seed": config.seed,
        "learning_rate": config.learning_rate,
    }
    if config.training_shape_id is not None:
        managed["training_shape_id"] = config.training_shape_id
    if config.deployment_id is not None:
        managed["deployment_id"] = config.deployment_id
    return FiretitanServiceClient.from_firetitan_config(
        api_key=api_key, base_url=config.base_url, **managed
    )
