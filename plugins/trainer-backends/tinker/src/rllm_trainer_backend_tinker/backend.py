"""The ``tinker`` trainer backend: LoRA training and sampling on Tinker's hosted models."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import tinker
from rllm_core.algorithms.native_losses import LossRoute, route_objective
from rllm_core.algorithms.objective import Objective
from rllm_core.kit.managed import ServiceCalls, service_metrics, supervised
from rllm_core.kit.token_hygiene import VocabBound, screen
from rllm_core.types import Datum

from rllm_trainer_backend_tinker.batch import build_batch, tinker_datum
from rllm_trainer_backend_tinker.checkpoint import read_state, write_state
from rllm_trainer_backend_tinker.loss import CustomLoss
from rllm_trainer_backend_tinker.native import native_datums, native_metrics, sdk_kernels
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker.sampler import TinkerSampler
from rllm_trainer_backend_tinker.transient import is_transient

__all__ = ["TinkerBackend"]


class TinkerBackend:
    """A :class:`~rllm_core.ports.TrainerBackend` on a Tinker LoRA training run, a
    :class:`~rllm_core.ports.SupervisedTrainer` on Tinker's own cross-entropy loss, and a
    :class:`~rllm_core.ports.LogprobScorer` (a forward pass of that loss; the RL losses still
    take the sampler's logprobs as proximal, see the spec's ``proximal_modes``).

    How it trains: :meth:`loss_route` picks, once per objective, the native or the custom
    path (``[trainer].loss_path``, see :mod:`rllm_core.algorithms.native_losses`). On the native
    path ``forward_backward`` calls Tinker's ``forward_backward(data, kernel, loss_fn_config)``: one
    fused pass of Tinker's ``importance_sampling``, ``ppo`` or ``cispo`` kernel, with the
    plan's aggregation folded into the advantages sent (see
    :mod:`rllm_trainer_backend_tinker.native`). On the custom path it calls
    ``forward_backward_custom``: Tinker runs the forward pass and returns each datum's
    per-token logprobs, the losses see them in a :class:`~rllm_core.ports.LossContext` exactly
    as on the torch backend (one context over the whole call, so the aggregation normalizers
    count every datum), and Tinker back-propagates the gradient of the summed loss with respect
    to those logprobs through the model. Both paths report the objective's metrics. The
    logprobs are at temperature 1, so plans sample at temperature 1.

    Before each ``forward_backward`` the datums Tinker would fail on (a token id outside
    ``[0, vocab_size)``, or without ``vocab_size`` outside the tokenizer's length; no sampled
    token) are dropped with a warning naming their session
    (:func:`rllm_core.kit.token_hygiene.screen`). When all of a call's datums are dropped,
    nothing is sent, and the next ``optim_step`` (unless another call kept datums) takes no
    step and publishes nothing: the weight version stays.

    ``optim_step`` runs Tinker's AdamW step with the configured hyperparameters, then saves the
    weights for sampling and publishes the new ``SamplingClient`` as the next weight version:
    client and version change together, under a lock, before ``optim_step`` returns. Each
    ``SamplingClient`` samples from its own saved weights, so sampling may run on the event loop
    while ``optim_step`` runs on another thread: a request in flight finishes on the client it
    started with and reports that client's version, and requests that start after the swap
    use the new one.
    ``save_state`` saves weights and optimizer state on Tinker and writes their ``tinker://``
    path into ``tinker_state.json`` in the state folder; ``load_state`` starts a new training
    client from that checkpoint. Tinker's RNG is not part of the state, so resuming continues
    the same weights, optimizer and counters but not bitwise the same samples.

    Every call to Tinker that fails transiently (see
    :mod:`rllm_trainer_backend_tinker.transient`) is sent again, up to ``retries`` times with
    jittered exponential backoff; other errors fail at once. ``forward_backward`` reports its
    retries as ``tinker/retries``; ``optim_step`` reports its own (publishing included) as
    ``tinker/retries`` and the sampler's since the previous step as ``tinker/sampler_retries``.

    ``service_client`` replaces the ``tinker.ServiceClient`` the backend would otherwise
    create (tests pass a fake; a caller may share one session between backends). A client
    passed in is not closed by :meth:`close`.
    """

    def __init__(self, config: TinkerBackendConfig, *, service_client: Any = None) -> None:
        self.config = config
        self._owns_service = service_client is None
        self._service = service_client if service_client is not None else _connect(config)
        self._lock = threading.Lock()
        self.calls = ServiceCalls("Tinker", config, transient=is_transient)
        self._training = self.calls.call(
            lambda: self._service.create_lora_training_client(
                base_model=config.model,
                rank=config.lora_rank,
                seed=config.seed,
                train_mlp=config.train_mlp,
                train_attn=config.train_attn,
                train_unembed=config.train_unembed,
            ),
            "creating the LoRA training client",
        )
        self._vocab = VocabBound(
            config.vocab_size, config.tokenizer, lambda: self._training.get_tokenizer(), "Tinker"
        )
        self._sampling_client = self._publish([])
        self._version = 0
        self._steps = 0
        self._pending = False
        self._skip_next = False
        self._routes: dict[int, tuple[Objective, LossRoute]] = {}
        self._sampler: TinkerSampler | None = None
        self._closed = False

    # ------------------------------------------------------------------ state

    @property
    def weight_version(self) -> int:
        """Increments with every ``optim_step``; restored by ``load_state``."""
        with self._lock:
            return self._version

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken, counting those restored by ``load_state``."""
        return self._steps

    @property
    def training_client(self) -> Any:
        """The current Tinker ``TrainingClient`` (replaced by ``load_state``)."""
        return self._training

    def current_sampling_client(self) -> tuple[Any, int]:
        """The newest published ``SamplingClient`` and its weight version, read together."""
        with self._lock:
            return self._sampling_client, self._version

    def sampler(self) -> TinkerSampler:
        """The sampler on the newest published weights (one per backend)."""
        self._check_open()
        if self._sampler is None:
            self._sampler = TinkerSampler(self)
        return self._sampler

    # ------------------------------------------------------------------ training

    def loss_route(self, objective: Objective) -> LossRoute:
        """Where ``objective`` trains on Tinker (native kernel or custom loss) and why; chosen
        once per objective from ``[trainer].loss_path`` and the kernels the installed SDK
        lists. Raises :class:`~rllm_core.algorithms.native_losses.NativeLossError` when
        ``loss_path = "native"`` and the objective has no kernel."""
        cached = self._routes.get(id(objective))
        if cached is not None and cached[0] is objective:
            return cached[1]
        route = route_objective(
            objective, service="tinker", available=sdk_kernels(), requested=self.config.loss_path
        )
        self._routes[id(objective)] = (objective, route)
        return route

    def forward_backward(self, datums: Sequence[Datum], objective: Objective) -> dict[str, float]:
        """Add the gradient of ``objective`` over ``datums`` on Tinker, on the path
        :meth:`loss_route` chose.

        Datums Tinker would fail on are dropped first (see the class docstring); invalid
        datums raise ``ValueError`` before anything is sent. Returns the metrics of
        :class:`~rllm_trainer_backend_tinker.loss.CustomLoss` (the objective's, token and sequence
        counts; on the native path evaluated without gradient on the logprobs the kernel
        returns), ``tinker/native`` (1.0 or 0.0), ``tinker/retries``, the drop counts
        ``tinker/dropped_datums``, ``tinker/dropped_out_of_vocab`` and ``tinker/dropped_empty``,
        and Tinker's own numeric metrics prefixed ``tinker/``. When every datum is dropped it
        returns the drop counts, ``tinker/skipped_step`` = 1.0 and zero ``tokens`` and
        ``sequences``.
        """
        self._check_open()
        route = self.loss_route(objective)
        screened = screen(datums, vocab_size=self._vocab(), service="tinker")
        hygiene = screened.metrics("tinker")
        if screened.dropped and not screened.kept:
            self._skip_next = True
            return {**hygiene, "tinker/skipped_step": 1.0, "tokens": 0.0, "sequences": 0.0}
        batch = build_batch(screened.kept)
        retries: list[int] = []
        if route.path == "native":
            sent = native_datums(screened.kept, objective)
            config = dict(route.config) or None
            output = self.calls.call(
                lambda: self._training.forward_backward(sent, route.kernel, loss_fn_config=config),
                "forward_backward",
                retries,
            )
            metrics = native_metrics(batch, objective, output.loss_fn_outputs)
        else:
            custom = CustomLoss(batch, objective)
            output = self.calls.call(
                lambda: self._training.forward_backward_custom(batch.tinker_datums, custom),
                "forward_backward",
                retries,
            )
            metrics = dict(custom.metrics)
        self._pending = True
        metrics.update(service_metrics(output.metrics, "tinker", besides=metrics))
        metrics["tinker/native"] = 1.0 if route.path == "native" else 0.0
        metrics["tinker/retries"] = float(len(retries))
        metrics.update(hygiene)
        return metrics

    def forward_backward_supervised(self, datums: Sequence[Datum]) -> dict[str, float]:
        """Add the gradient of the mean negative log-likelihood of ``datums``' trained tokens
        (``action_mask``), on Tinker's own ``cross_entropy`` loss: one forward and backward
        pass, no logprobs sent back and forth (see
        :mod:`rllm_core.kit.managed.supervised` for the weights that make Tinker's sum that
        mean).

        Invalid datums raise ``ValueError`` before anything is sent. Returns ``nll`` (the mean,
        from the logprobs Tinker returns), ``tokens`` (trained tokens), ``sequences``, and
        Tinker's own numeric metrics prefixed ``tinker/`` (``tinker/loss:sum`` is its sum of
        the weighted losses, the same mean in float32).
        """
        self._check_open()
        metrics = supervised.forward_backward_supervised(
            self.calls, self._training, datums, tinker_datum, "tinker"
        )
        self._pending = True
        return metrics

    def compute_logprobs(self, datums: Sequence[Datum]) -> list[list[float]]:
        """Each datum's per-token logprobs under the current weights (0.0 at position 0), at
        temperature 1, from a forward pass of Tinker's ``cross_entropy`` loss: no gradient,
        nothing of the training run changes. ``rllm-core sft`` scores its eval split with it.
        """
        self._check_open()
        return supervised.compute_logprobs(self.calls, self._training, datums, tinker_datum)

    def optim_step(self) -> dict[str, float]:
        """Step Tinker's AdamW, publish the new weights to the sampler and return
        ``learning_rate``, ``step``, ``tinker/skipped_step`` (0.0) and Tinker's step metrics
        (prefixed ``tinker/``). After a ``forward_backward`` whose datums were all dropped
        (and no other since), nothing is sent: no step, no publishing, the weight version and
        ``step`` stay, and ``tinker/skipped_step`` is 1.0. Raises ``RuntimeError`` when no
        ``forward_backward`` preceded it."""
        self._check_open()
        config = self.config
        if not self._pending and self._skip_next:
            self._skip_next = False
            return {
                "learning_rate": config.learning_rate,
                "step": float(self._steps),
                "tinker/skipped_step": 1.0,
                "tinker/retries": 0.0,
                "tinker/sampler_retries": float(self.calls.take_sampler_retries()),
            }
        if not self._pending:
            raise RuntimeError(
                "optim_step() without gradients: call forward_backward(...) or"
                " forward_backward_supervised(...) first"
            )
        params = tinker.types.AdamParams(**config.adam_params())
        retries: list[int] = []
        response = self.calls.call(lambda: self._training.optim_step(params), "optim_step", retries)
        self._pending = False
        self._skip_next = False
        self._steps += 1
        client = self._publish(retries)
        with self._lock:
            self._sampling_client = client
            self._version += 1
        metrics = {
            "learning_rate": config.learning_rate,
            "step": float(self._steps),
            "tinker/skipped_step": 0.0,
        }
        metrics.update(service_metrics(response.metrics, "tinker"))
        metrics["tinker/retries"] = float(len(retries))
        metrics["tinker/sampler_retries"] = float(self.calls.take_sampler_retries())
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def identity(self) -> dict[str, Any]:
        """What a state folder must match to load into this backend."""
        config = self.config
        return {
            "model": config.model,
            "lora_rank": config.lora_rank,
            "train_mlp": config.train_mlp,
            "train_attn": config.train_attn,
            "train_unembed": config.train_unembed,
        }

    def save_state(self, path: str) -> None:
        """Save weights and optimizer state on Tinker as ``<checkpoint_prefix>-step<N>`` and
        write ``tinker_state.json`` into the folder ``path``. Raises ``RuntimeError`` between
        ``forward_backward`` and ``optim_step``, where saving would drop the gradients."""
        self._check_open()
        if self._pending:
            raise RuntimeError(
                "save_state() after forward_backward() and before optim_step() would lose the"
                " accumulated gradients; call optim_step() first"
            )
        name = f"{self.config.checkpoint_prefix}-step{self._steps:06d}"
        saved = self.calls.call(
            lambda: self._training.save_state(
                name, ttl_seconds=self.config.checkpoint_ttl_s, overwrite=True
            ),
            f"saving checkpoint {name!r}",
            idempotent=True,
        )
        write_state(
            path,
            tinker_path=saved.path,
            identity=self.identity(),
            counters={"optimizer_steps": self._steps, "weight_version": self.weight_version},
        )

    def load_state(self, path: str) -> None:
        """Continue from a folder written by :meth:`save_state`: a new Tinker training client
        starts from its weights and optimizer state, its sampler weights are published, and
        the counters are restored. Raises
        :class:`~rllm_trainer_backend_tinker.checkpoint.CheckpointError` for a folder of another
        base model or LoRA shape. Pending gradients are dropped."""
        self._check_open()
        tinker_path, counters = read_state(path, identity=self.identity())
        training = self.calls.call(
            lambda: self._service.create_training_client_from_state_with_optimizer(tinker_path),
            f"loading checkpoint {tinker_path}",
        )
        self._training = training
        client = self._publish([])
        self._pending = False
        self._skip_next = False
        self._steps = counters["optimizer_steps"]
        with self._lock:
            self._sampling_client = client
            self._version = counters["weight_version"]

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop using Tinker; closes the service client when the backend created it. Calling
        it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._sampler = None
        if self._owns_service:
            self._service.close()

    def _publish(self, retries: list[int]) -> Any:
        return self.calls.call(
            lambda: self._training.save_weights_and_get_sampling_client(),
            "publishing sampler weights",
            retries,
            idempotent=True,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this TinkerBackend is closed; build a new one")


def _connect(config: TinkerBackendConfig) -> Any:
    try:
        return tinker.ServiceClient(base_url=config.base_url)
    except tinker.AuthenticationError as exc:
        raise RuntimeError(
            f"Tinker refused the credentials ({exc}); set TINKER_API_KEY to a valid key"
        ) from exc
