"""Conformance suite for trainer backends (the :class:`~rllm_core.ports.TrainerBackend` port).

Subclass the suite in a test module and provide its fixtures::

    class TestMyBackend(TrainerBackendConformance):
        @pytest.fixture
        def build_trainer_backend(self, tmp_path):
            return lambda: MyBackend(MyConfig(model=str(tmp_path / "model"), seed=0))

        @pytest.fixture
        def trainer_backend_spec(self):
            return MY_SPEC

Fixtures:

- ``build_trainer_backend`` (required): a callable returning a new backend, configured the same
  way (same model, same seed) every time it is called: two of them trained on the same datums
  must agree. The suite closes every backend it builds.
- ``trainer_backend_spec`` (optional): the backend's :class:`~rllm_core.ComponentSpec`; its
  traits then hold the backend to what they declare.
- ``trainer_datums`` (optional): two batches of datums the backend can train on; by default
  :func:`make_trainer_datums` (token ids below 32).
- ``sample_request`` (optional): a request the backend's sampler can answer; by default a
  short prompt of ids below 32. ``None`` skips the sampling check.

The class attribute ``resume_tolerance`` is the largest difference allowed between the metrics
of a resumed run and those of a run that never stopped (0: bitwise equal, as the port asks).

What the checks hold the backend to:

- a new backend is at ``weight_version`` 0, and so is its sampler;
- ``forward_backward`` evaluates the objective on the datums' own values (the losses see each
  action token's sampler logprob and advantage), returns float metrics holding those of the
  objective (``loss``, ``<term>/loss``, the terms' own, ``action_tokens``,
  ``observation_tokens``) plus ``tokens`` (every token of the datums) and ``sequences``, the
  backend's own with a ``<prefix>/`` (its spec name when a spec is given), and leaves
  ``weight_version`` alone;
- ``optim_step`` returns float metrics and increments ``weight_version`` by one however many
  ``forward_backward`` calls preceded it; the sampler reports the new version, and so does a
  sample taken after it; a step that reports ``<name>/skipped_step = 1.0`` changes nothing;
- ``save_state`` then ``load_state``, into the same backend or a new one, restores
  ``weight_version`` and continues exactly as the run that never stopped;
- with ``deterministic`` set in its config, two backends give equal metrics on the same datums;
- ``close`` may be called twice, and a closed backend refuses to train;
- what the backend also offers: :class:`~rllm_core.ports.LogprobScorer` (one logprob per token,
  0.0 first, the logprobs the losses see, no state change; with ``proximal = "recompute"`` the
  datums' ``proximal_logprobs`` reach the losses as ``old_logprobs``),
  :class:`~rllm_core.ports.SupervisedTrainer`, :class:`~rllm_core.ports.WeightReleaser`,
  :class:`~rllm_core.ports.Interruptible`, :class:`~rllm_core.ports.LossRouting` and
  :class:`~rllm_core.ports.NumericsReport`, each checked only when present;
- the spec's traits: ``"recompute"`` among ``proximal_modes`` needs ``LogprobScorer``,
  ``exports_weights`` needs ``WeightExporter``, ``native_losses`` needs ``LossRouting`` and a
  ``loss_path`` key, ``packs_sequences`` trains a packed datum as its examples apart.

Every test method takes its fixtures as arguments, so a test can call one directly with a
hand-built backend. :func:`make_trainer_datums` and :class:`RecordingLoss` are public for a
backend's own tests.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from rllm_core.algorithms.objective import Objective
from rllm_core.plugins.specs import ComponentSpec
from rllm_core.ports import (
    Interruptible,
    LogprobScorer,
    LossContext,
    LossOutput,
    LossRouting,
    NumericsReport,
    Sampler,
    SupervisedTrainer,
    TrainerBackend,
    WeightExporter,
    WeightReleaser,
)
from rllm_core.types import Datum, SampleRequest, SampleResult, SamplingParams

torch = pytest.importorskip("torch")

__all__ = ["RecordingLoss", "TrainerBackendConformance", "make_trainer_datums"]

# What the `new_backend` and `trainer_datums` fixtures give.
NewBackend = Callable[[], Any]
DatumPair = tuple[list[Datum], list[Datum]]

_OBJECTIVE_COUNTS = ("loss", "action_tokens", "observation_tokens", "tokens", "sequences")


def make_trainer_datums(
    seed: int = 0, lengths: Sequence[int] = (7, 5, 9), *, vocab: int = 32
) -> list[Datum]:
    """One seeded datum per length: two prompt tokens, then alternating pairs of action and
    observation tokens, token ids in ``[1, vocab)``. Sampler logprobs are distinct negative
    values on action tokens (0.0 elsewhere, as a sampler records them); advantages are one
    value per datum, of mixed signs."""
    generator = torch.Generator().manual_seed(seed)
    datums = []
    for index, length in enumerate(lengths):
        ids = torch.randint(1, vocab, (length,), generator=generator).tolist()
        action = [i >= 2 and i % 4 in (2, 3) for i in range(length)]
        observation = [i >= 2 and not a for i, a in enumerate(action)]
        drawn = -0.2 - 3.0 * torch.rand(length, generator=generator, dtype=torch.float64)
        advantage = (-1.0) ** index * (0.25 + 0.5 * index)
        datums.append(
            Datum(
                token_ids=ids,
                logprobs=[lp if a else 0.0 for lp, a in zip(drawn.tolist(), action, strict=True)],
                advantages=[advantage] * length,
                action_mask=action,
                observation_mask=observation,
            )
        )
    return datums


class RecordingLoss:
    """REINFORCE (``-A * logprob`` over action tokens, through ``ctx.aggregate``) that keeps a
    detached copy of every context it is given, and reports ``logprob_mean``."""

    name = "conformance"

    def __init__(self) -> None:
        self.contexts: list[LossContext] = []

    def __call__(self, ctx: LossContext) -> LossOutput:
        self.contexts.append(
            LossContext(
                logprobs=ctx.logprobs.detach().clone(),
                old_logprobs=ctx.old_logprobs.detach().clone(),
                rollout_logprobs=ctx.rollout_logprobs.detach().clone(),
                advantages=ctx.advantages.detach().clone(),
                action_mask=ctx.action_mask.detach().clone(),
                observation_mask=ctx.observation_mask.detach().clone(),
                aggregate=ctx.aggregate,
            )
        )
        with torch.no_grad():
            mask = ctx.action_mask != 0
            mean = ctx.logprobs[mask].double().mean().item() if bool(mask.any()) else 0.0
        return LossOutput(
            loss=ctx.aggregate(-ctx.advantages * ctx.logprobs, ctx.action_mask),
            metrics={"logprob_mean": mean},
        )

    def seen(self, field: str) -> list[float]:
        """Every value of ``field`` the loss saw on action tokens, sorted."""
        values: list[float] = []
        for ctx in self.contexts:
            values += getattr(ctx, field)[ctx.action_mask != 0].double().tolist()
        return sorted(values)


def _on_actions(datums: Sequence[Datum], values: Callable[[Datum], Sequence[float]]) -> list[float]:
    return sorted(
        float(v) for d in datums for v, a in zip(values(d), d.action_mask, strict=True) if a
    )


def _objective(loss: RecordingLoss, **options: Any) -> Objective:
    return Objective.of(loss, name=RecordingLoss.name, **options)


def _assert_float_metrics(metrics: Any, call: str) -> dict[str, float]:
    assert isinstance(metrics, Mapping), f"{call} returned {type(metrics).__name__}, not a mapping"
    for name, value in metrics.items():
        assert isinstance(name, str) and name, f"{call}: metric name {name!r}"
        assert isinstance(value, float), (
            f"{call}: metric {name!r} is {type(value).__name__}; report python floats"
        )
    return dict(metrics)


def _skipped(metrics: Mapping[str, float]) -> bool:
    return any(name.endswith("/skipped_step") and value == 1.0 for name, value in metrics.items())


def _assert_close_metrics(
    got: Mapping[str, float], expected: Mapping[str, float], tolerance: float, case: str
) -> None:
    assert got.keys() == expected.keys(), (
        f"{case}: metric names differ: {sorted(got.keys() ^ expected.keys())}"
    )
    for name, value in expected.items():
        other = got[name]
        same = other == value or (math.isnan(other) and math.isnan(value))
        assert same or abs(other - value) <= tolerance, (
            f"{case}: {name} is {other}, the run that never stopped has {value}"
        )


@pytest.mark.rllm_conformance
class TrainerBackendConformance:
    """The :class:`~rllm_core.ports.TrainerBackend` contract; see the module docstring."""

    resume_tolerance: ClassVar[float] = 0.0

    @pytest.fixture
    def build_trainer_backend(self) -> NewBackend:
        pytest.fail(
            f"{type(self).__name__} must define a 'build_trainer_backend' fixture returning a"
            " callable that builds the backend"
        )

    @pytest.fixture
    def trainer_backend_spec(self) -> ComponentSpec | None:
        return None

    @pytest.fixture
    def trainer_datums(self) -> DatumPair:
        return make_trainer_datums(0), make_trainer_datums(1, (6, 8))

    @pytest.fixture
    def sample_request(self) -> SampleRequest | None:
        return SampleRequest(
            prompt_token_ids=[3, 5, 7, 11], params=SamplingParams(max_tokens=3, seed=0)
        )

    @pytest.fixture
    def new_backend(self, build_trainer_backend: NewBackend) -> Iterator[NewBackend]:
        built: list[Any] = []

        def build() -> Any:
            built.append(build_trainer_backend())
            return built[-1]

        yield build
        for backend in built:
            backend.close()

    # ------------------------------------------------------------------ the port

    def test_a_new_backend_is_at_version_0(self, new_backend: NewBackend) -> None:
        backend = new_backend()
        assert isinstance(backend, TrainerBackend), (
            f"{type(backend).__name__} lacks a method or property of the TrainerBackend port"
        )
        assert backend.weight_version == 0 and type(backend.weight_version) is int, (
            f"a new backend reports weight_version {backend.weight_version!r}, not 0"
        )
        sampler = backend.sampler()
        assert isinstance(sampler, Sampler), f"sampler() returned {type(sampler).__name__}"
        assert sampler.weight_version == 0, f"its sampler reports {sampler.weight_version}"

    def test_forward_backward_evaluates_the_objective_on_the_datums(
        self,
        new_backend: NewBackend,
        trainer_datums: DatumPair,
        trainer_backend_spec: ComponentSpec | None,
    ) -> None:
        backend = new_backend()
        datums = trainer_datums[0]
        loss = RecordingLoss()
        metrics = _assert_float_metrics(
            backend.forward_backward(datums, _objective(loss)), "forward_backward"
        )
        expected = {
            "tokens": float(sum(len(d.token_ids) for d in datums)),
            "sequences": float(len(datums)),
            "action_tokens": float(sum(sum(d.action_mask) for d in datums)),
            "observation_tokens": float(sum(sum(d.observation_mask) for d in datums)),
        }
        for name in (*_OBJECTIVE_COUNTS, "conformance/loss", "conformance/logprob_mean"):
            assert name in metrics, f"forward_backward's metrics lack {name!r}: {sorted(metrics)}"
        for name, value in expected.items():
            assert metrics[name] == value, f"{name} is {metrics[name]}, the datums hold {value}"
        assert math.isfinite(metrics["loss"]), f"loss is {metrics['loss']}"
        prefix = f"{trainer_backend_spec.name}/" if trainer_backend_spec is not None else "/"
        objective_prefixes = ("conformance/", "offpolicy/", "correction/")
        for name in metrics:
            if name in _OBJECTIVE_COUNTS or name.startswith(objective_prefixes):
                continue
            assert prefix in name and (prefix == "/" or name.startswith(prefix)), (
                f"metric {name!r} is neither the objective's nor prefixed '{prefix.strip('/')}/'"
            )

        assert loss.contexts, "forward_backward never evaluated the objective"
        seen = loss.seen("rollout_logprobs")
        sent = _on_actions(datums, lambda d: d.logprobs)
        assert seen == pytest.approx(sent, abs=1e-5), (
            "the losses did not see the datums' sampler logprobs on action tokens"
        )
        seen = loss.seen("advantages")
        sent = _on_actions(datums, lambda d: d.advantages)
        assert seen == pytest.approx(sent, abs=1e-5), (
            "the losses did not see the datums' advantages on action tokens"
        )
        assert backend.weight_version == 0, "forward_backward changed weight_version"

    def test_optim_step_publishes_one_new_version(
        self,
        new_backend: NewBackend,
        trainer_datums: DatumPair,
        sample_request: SampleRequest | None,
    ) -> None:
        backend = new_backend()
        first, second = trainer_datums
        for version, calls in ((1, [first]), (2, [first, second])):
            for datums in calls:
                backend.forward_backward(datums, _objective(RecordingLoss()))
            metrics = _assert_float_metrics(backend.optim_step(), "optim_step")
            assert not _skipped(metrics), f"optim_step skipped a step of valid datums: {metrics}"
            assert backend.weight_version == version, (
                f"after {version} optimizer steps ({len(calls)} forward_backward calls before"
                f" the last) weight_version is {backend.weight_version}"
            )
            assert backend.sampler().weight_version == version, (
                f"the sampler reports {backend.sampler().weight_version} after optim_step"
                f" published version {version}"
            )
        if sample_request is None:
            return
        result = asyncio.run(backend.sampler().sample(sample_request))
        assert isinstance(result, SampleResult), f"sample returned {type(result).__name__}"
        assert result.weight_version == 2, (
            f"a sample taken after version 2 was published reports {result.weight_version}"
        )

    def test_a_skipped_step_changes_nothing(self, new_backend: NewBackend) -> None:
        backend = new_backend()
        # Token id -1 is outside every vocabulary: a backend refuses it or leaves it out.
        bad = Datum(
            token_ids=[1, 2, -1, 3],
            logprobs=[0.0, 0.0, -1.0, -1.0],
            advantages=[1.0] * 4,
            action_mask=[False, False, True, True],
            observation_mask=[False] * 4,
        )
        try:
            with warnings.catch_warnings():
                # A backend that leaves a datum out says so; here that is expected.
                warnings.simplefilter("ignore")
                backend.forward_backward([bad], _objective(RecordingLoss()))
            metrics = backend.optim_step()
        except Exception:
            return
        assert _skipped(metrics), (
            f"optim_step after a call that could not train stepped anyway: {metrics}"
        )
        assert backend.weight_version == 0, "a skipped step changed weight_version"

    def test_save_load_continues_as_if_never_stopped(
        self, new_backend: NewBackend, trainer_datums: DatumPair, tmp_path: Any
    ) -> None:
        first, second = trainer_datums
        state = os.path.join(str(tmp_path), "state")

        def two_steps(backend: Any) -> dict[str, float]:
            """Metrics of a step on ``second``, then of one on ``first``, whose loss shows
            the weights the first step left."""
            metrics: dict[str, float] = {}
            for label, datums in (("a", second), ("b", first)):
                step = backend.forward_backward(datums, _objective(RecordingLoss()))
                step = dict(step) | {f"optim/{k}": v for k, v in backend.optim_step().items()}
                metrics |= {f"{label}/{k}": v for k, v in step.items()}
            return metrics

        straight = new_backend()
        straight.forward_backward(first, _objective(RecordingLoss()))
        straight.optim_step()
        straight.save_state(state)
        expected = two_steps(straight)
        assert straight.weight_version == 3

        straight.load_state(state)
        assert straight.weight_version == 1, (
            f"load_state of a state saved at version 1 left weight_version at"
            f" {straight.weight_version}"
        )
        assert straight.sampler().weight_version == 1, (
            "after load_state the sampler does not report the loaded version"
        )
        _assert_close_metrics(
            two_steps(straight), expected, self.resume_tolerance, "reloaded in place"
        )

        resumed = new_backend()
        resumed.load_state(state)
        assert resumed.weight_version == 1, (
            f"a new backend that loaded a state of version 1 reports {resumed.weight_version}"
        )
        _assert_close_metrics(
            two_steps(resumed), expected, self.resume_tolerance, "resumed in a new backend"
        )
        assert resumed.weight_version == 3

    def test_deterministic_backends_agree(
        self, new_backend: NewBackend, trainer_datums: DatumPair
    ) -> None:
        one, two = new_backend(), new_backend()
        if getattr(getattr(one, "config", None), "deterministic", None) is not True:
            pytest.skip("the backend's config has no deterministic key set to true")
        runs = []
        for backend in (one, two):
            metrics = {}
            for datums in trainer_datums:
                metrics |= backend.forward_backward(datums, _objective(RecordingLoss()))
                metrics |= backend.optim_step()
            runs.append(metrics)
        _assert_close_metrics(runs[1], runs[0], 0.0, "a second deterministic backend")

    def test_close_twice_and_refuse_work_after(
        self, new_backend: NewBackend, trainer_datums: DatumPair
    ) -> None:
        backend = new_backend()
        backend.close()
        backend.close()
        try:
            backend.forward_backward(trainer_datums[0], _objective(RecordingLoss()))
        except Exception:
            return
        pytest.fail("a closed backend trained on; raise an error after close()")

    # ------------------------------------------------------------------ what it may also offer

    def test_logprob_scorer(
        self,
        new_backend: NewBackend,
        trainer_datums: DatumPair,
        trainer_backend_spec: ComponentSpec | None,
    ) -> None:
        backend = new_backend()
        recompute = trainer_backend_spec is not None and "recompute" in trainer_backend_spec.trait(
            "proximal_modes"
        )
        if not isinstance(backend, LogprobScorer):
            assert not recompute, (
                "the spec lists 'recompute' among proximal_modes, but the backend has no"
                " compute_logprobs (LogprobScorer)"
            )
            pytest.skip("the backend is not a LogprobScorer")
        datums = trainer_datums[0]
        scored = backend.compute_logprobs(datums)
        assert [len(row) for row in scored] == [len(d.token_ids) for d in datums], (
            "compute_logprobs must return one logprob per token of each datum"
        )
        for index, row in enumerate(scored):
            assert row[0] == 0.0, f"datum {index}: the first token's logprob is {row[0]}, not 0.0"
            assert all(isinstance(v, float) and math.isfinite(v) and v <= 0 for v in row), (
                f"datum {index}: logprobs {row} are not finite non-positive floats"
            )
        assert backend.compute_logprobs(datums) == scored, "a second call scored differently"
        assert backend.weight_version == 0, "compute_logprobs changed weight_version"

        loss = RecordingLoss()
        backend.forward_backward(datums, _objective(loss))
        pairs = [(p, list(d.action_mask)) for p, d in zip(scored, datums, strict=True)]
        on_actions = sorted(v for row, mask in pairs for v, a in zip(row, mask, strict=True) if a)
        assert loss.seen("logprobs") == pytest.approx(on_actions, abs=1e-4), (
            "compute_logprobs differs from the logprobs forward_backward gives the losses"
        )
        if not recompute:
            return
        from msgspec.structs import replace

        proximal = [
            replace(d, proximal_logprobs=[v - 0.5 for v in row])
            for d, row in zip(datums, scored, strict=True)
        ]
        loss = RecordingLoss()
        backend.forward_backward(proximal, _objective(loss, proximal="recompute"))
        assert loss.seen("old_logprobs") == pytest.approx(
            _on_actions(proximal, lambda d: d.proximal_logprobs or []), abs=1e-5
        ), "with proximal = 'recompute' the losses' old_logprobs are not the proximal_logprobs"

    def test_supervised_trainer(self, new_backend: NewBackend, trainer_datums: DatumPair) -> None:
        backend = new_backend()
        if not isinstance(backend, SupervisedTrainer):
            pytest.skip("the backend is not a SupervisedTrainer")
        datums = trainer_datums[0]
        metrics = _assert_float_metrics(
            backend.forward_backward_supervised(datums), "forward_backward_supervised"
        )
        trained = float(sum(sum(d.action_mask) for d in datums))
        assert metrics.get("tokens") == trained, (
            f"tokens is {metrics.get('tokens')}; the datums hold {trained} trained tokens"
        )
        assert metrics.get("sequences") == float(len(datums))
        assert "nll" in metrics and 0 < metrics["nll"] < math.inf, f"nll is {metrics.get('nll')}"
        backend.optim_step()
        assert backend.weight_version == 1

    def test_weight_releaser(
        self, new_backend: NewBackend, trainer_datums: DatumPair, tmp_path: Any
    ) -> None:
        trainer = new_backend()
        if not isinstance(trainer, WeightReleaser):
            pytest.skip("the backend is not a WeightReleaser")
        trainer.forward_backward(trainer_datums[0], _objective(RecordingLoss()))
        trainer.optim_step()
        release = os.path.join(str(tmp_path), "release")
        trainer.save_weights(release)
        assert trainer.weight_version == 1, "save_weights changed weight_version"
        follower = new_backend()
        follower.load_weights(release, 7)
        assert follower.weight_version == 7, (
            f"load_weights(path, 7) left weight_version at {follower.weight_version}"
        )
        assert follower.sampler().weight_version == 7, "its sampler does not report version 7"
        if isinstance(trainer, LogprobScorer):
            datums = trainer_datums[1]
            got = [v for row in follower.compute_logprobs(datums) for v in row]
            saved = [v for row in trainer.compute_logprobs(datums) for v in row]
            assert got == pytest.approx(saved, abs=1e-6), (
                "the loaded weights score differently from the ones saved"
            )

    def test_interruptible(self, new_backend: NewBackend, trainer_datums: DatumPair) -> None:
        from rllm_core.errors import TrainingInterrupted

        backend = new_backend()
        if not isinstance(backend, Interruptible):
            pytest.skip("the backend is not Interruptible")
        backend.interrupt()
        with pytest.raises(TrainingInterrupted):
            backend.forward_backward(trainer_datums[0], _objective(RecordingLoss()))
        assert backend.weight_version == 0
        backend.forward_backward(trainer_datums[0], _objective(RecordingLoss()))
        backend.optim_step()
        assert backend.weight_version == 1, "the interrupt was not used up by the call it stopped"

    def test_loss_routing(
        self, new_backend: NewBackend, trainer_backend_spec: ComponentSpec | None
    ) -> None:
        backend = new_backend()
        natives = trainer_backend_spec.trait("native_losses") if trainer_backend_spec else ()
        if not isinstance(backend, LossRouting):
            assert not natives, (
                f"the spec lists native_losses {natives}, but the backend has no loss_route"
            )
            pytest.skip("the backend does not route losses")
        if natives:
            assert trainer_backend_spec is not None
            assert "loss_path" in trainer_backend_spec.config.model_fields, (
                "a backend with native_losses has a loss_path key in its config"
            )
        objective = _objective(RecordingLoss())
        route = backend.loss_route(objective)
        assert route.path in ("native", "custom"), f"loss_route gave path {route.path!r}"
        assert backend.loss_route(objective) == route, "the same objective got another route"

    def test_numerics_are_json(self, new_backend: NewBackend) -> None:
        backend = new_backend()
        if not isinstance(backend, NumericsReport):
            pytest.skip("the backend reports no numerics")
        json.dumps(dict(backend.numerics()))

    def test_spec_traits(
        self, new_backend: NewBackend, trainer_backend_spec: ComponentSpec | None
    ) -> None:
        if trainer_backend_spec is None:
            pytest.skip("provide a 'trainer_backend_spec' fixture to check the spec's traits")
        backend = new_backend()
        if trainer_backend_spec.trait("exports_weights"):
            assert isinstance(backend, WeightExporter), (
                "the spec declares exports_weights, but the backend has no export_weights"
            )
        if not trainer_backend_spec.trait("packs_sequences"):
            return
        examples = make_trainer_datums(2, (6, 7))
        packed = Datum(
            token_ids=[t for d in examples for t in d.token_ids],
            logprobs=[v for d in examples for v in d.logprobs],
            advantages=[v for d in examples for v in d.advantages],
            action_mask=[v for d in examples for v in d.action_mask],
            observation_mask=[v for d in examples for v in d.observation_mask],
            metadata={"packed_lengths": [len(d.token_ids) for d in examples]},
        )
        apart = backend.forward_backward(examples, _objective(RecordingLoss()))
        together = backend.forward_backward([packed], _objective(RecordingLoss()))
        for name in ("loss", "tokens", "sequences", "action_tokens"):
            assert together[name] == pytest.approx(apart[name], abs=1e-5), (
                f"packs_sequences: a packed datum gives {name} {together[name]}, its examples"
                f" apart {apart[name]}"
            )
