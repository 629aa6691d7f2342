"""Conformance suites for losses and advantage estimators.

A plugin's test module subclasses a suite and provides its fixtures::

    from rllm_core.testing.suites.losses import LossConformance

    class TestMyLoss(LossConformance):
        @pytest.fixture
        def loss_spec(self):
            return MY_SPEC

        @pytest.fixture
        def loss(self, loss_spec):
            return loss_spec.build({})

:class:`LossConformance` checks the :class:`~rllm_core.ports.Loss` contract,
:class:`AdvantageEstimatorConformance` the :class:`~rllm_core.ports.AdvantageEstimator` one.
A plugin with several losses, or configs worth checking, runs the suite once per
``(loss name, config)`` case through :func:`loss_conformance_cases`::

    class TestMyLosses(loss_conformance_cases(plugin.rllm_losses(), [("my-loss", {}), ...])):
        pass

:func:`make_loss_context` and :func:`split_loss_context` build the inputs the suite uses and are
public so plugin tests can reuse them.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from rllm_core.algorithms.aggregation import AGGREGATION_MODES, make_aggregate, step_normalizers
from rllm_core.plugins.specs import ComponentSpec
from rllm_core.ports.losses import AdvantageResult, LossContext, LossOutput

torch = pytest.importorskip("torch")

__all__ = [
    "DEFAULT_LENGTHS",
    "AdvantageEstimatorConformance",
    "LossConformance",
    "context_from_lists",
    "loss_conformance_cases",
    "make_loss_context",
    "split_loss_context",
    "trained_mask",
]

DEFAULT_LENGTHS: tuple[int, ...] = (7, 4, 9, 1)
"""Real tokens per sequence in a default context; the 1-token sequence has nothing to train."""

_TENSOR_FIELDS = (
    "logprobs",
    "old_logprobs",
    "rollout_logprobs",
    "advantages",
    "action_mask",
    "observation_mask",
)


def make_loss_context(
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    seed: int = 0,
    aggregation: str = "token-mean",
    norm_length: float | None = None,
    log_ratio: float | None = None,
    advantage: float | None = None,
    rollout_drift: float = 0.05,
    dtype: torch.dtype | None = None,
) -> LossContext:
    """A seeded, right-padded :class:`~rllm_core.ports.LossContext` of ragged sequences.

    Sequence ``b`` has ``lengths[b]`` real tokens followed by padding up to ``max(lengths)``.
    Token 0 is prompt; after it, every third token (``t % 3 == 0``) is an observation and the
    others are actions, so a sequence of length 1 has no action token.

    Every position, padding included, holds ordinary finite values, so a loss that forgets a
    mask shows it in its gradient:

    - ``old_logprobs`` are uniform in ``[-3, -0.05]``;
    - ``rollout_logprobs`` are ``old_logprobs`` plus Gaussian noise of std ``rollout_drift``;
    - ``logprobs`` are ``old_logprobs + log_ratio`` when ``log_ratio`` is given, else
      ``old_logprobs`` plus Gaussian noise of std 0.1; it is a leaf that requires grad;
    - ``advantages`` are ``advantage`` everywhere when given, else one value per sequence,
      centred over the batch (mixed signs, as a group-relative estimator gives).

    ``aggregate`` uses ``aggregation`` with normalizers counted on this context's action mask
    (``norm_length`` defaults to ``max(lengths)``). ``dtype`` defaults to float32.
    """
    if not lengths or any(length < 1 for length in lengths):
        raise ValueError(f"lengths must be a non-empty sequence of positive ints, got {lengths!r}")
    dtype = dtype or torch.float32
    batch, width = len(lengths), max(lengths)
    generator = torch.Generator().manual_seed(seed)

    def noise(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    positions = torch.arange(width)
    real = positions[None, :] < torch.tensor(list(lengths))[:, None]
    after_prompt = real & (positions[None, :] > 0)
    observation = after_prompt & (positions[None, :] % 3 == 0)
    action = after_prompt & ~observation

    old = -(0.05 + 2.95 * torch.rand(batch, width, generator=generator, dtype=torch.float64))
    rollout = old + rollout_drift * noise(batch, width)
    current = old + (log_ratio if log_ratio is not None else 0.1 * noise(batch, width))
    if advantage is not None:
        advantages = torch.full((batch, width), float(advantage), dtype=torch.float64)
    else:
        per_sequence = noise(batch)
        advantages = (per_sequence - per_sequence.mean())[:, None].expand(batch, width)

    total_tokens, total_sequences = step_normalizers([action])
    aggregate = make_aggregate(
        aggregation,
        total_tokens=total_tokens,
        total_sequences=total_sequences,
        norm_length=norm_length if norm_length is not None else width,
    )
    return LossContext(
        logprobs=current.to(dtype).requires_grad_(True),
        old_logprobs=old.to(dtype),
        rollout_logprobs=rollout.to(dtype),
        advantages=advantages.to(dtype).contiguous(),
        action_mask=action.to(dtype),
        observation_mask=observation.to(dtype),
        aggregate=aggregate,
    )


def context_from_lists(
    logprobs: list[list[float]],
    *,
    advantages: list[list[float]],
    action_mask: list[list[float]],
    old_logprobs: list[list[float]] | None = None,
    rollout_logprobs: list[list[float]] | None = None,
    observation_mask: list[list[float]] | None = None,
    mode: str = "token-mean",
    norm_length: float | None = None,
) -> tuple[LossContext, torch.Tensor]:
    """Build a one-micro-batch context from plain nested lists, for hand-computed loss tests.

    Returns the context and the ``logprobs`` leaf (float64, requires grad). ``old_logprobs``
    and ``rollout_logprobs`` default to each other, then to the detached logprobs; the
    aggregate is ``mode`` with this micro-batch's action mask as the whole step.
    """
    leaf = torch.tensor(logprobs, dtype=torch.float64, requires_grad=True)
    old = old_logprobs if old_logprobs is not None else rollout_logprobs
    rollout = rollout_logprobs if rollout_logprobs is not None else old_logprobs
    mask = torch.tensor(action_mask, dtype=torch.float64)
    tokens, sequences = step_normalizers([mask])
    ctx = LossContext(
        logprobs=leaf,
        old_logprobs=torch.tensor(old, dtype=torch.float64)
        if old is not None
        else leaf.detach().clone(),
        rollout_logprobs=torch.tensor(rollout, dtype=torch.float64)
        if rollout is not None
        else leaf.detach().clone(),
        advantages=torch.tensor(advantages, dtype=torch.float64),
        action_mask=mask,
        observation_mask=torch.tensor(observation_mask, dtype=torch.float64)
        if observation_mask is not None
        else torch.zeros_like(mask),
        aggregate=make_aggregate(
            mode, total_tokens=tokens, total_sequences=sequences, norm_length=norm_length
        ),
    )
    return ctx, leaf


def split_loss_context(ctx: LossContext, sizes: Sequence[int]) -> list[LossContext]:
    """Split ``ctx`` into micro-batches of ``sizes`` sequences that share its aggregate.

    Micro-batch tensors are views of ``ctx``'s, so gradients of micro-batch losses accumulate
    into ``ctx.logprobs.grad``.
    """
    if sum(sizes) != ctx.logprobs.shape[0] or any(size < 1 for size in sizes):
        raise ValueError(
            f"sizes {list(sizes)} must be positive and add up to the batch size"
            f" {ctx.logprobs.shape[0]}"
        )
    pieces = {name: torch.split(getattr(ctx, name), list(sizes)) for name in _TENSOR_FIELDS}
    return [
        LossContext(aggregate=ctx.aggregate, **{name: pieces[name][i] for name in _TENSOR_FIELDS})
        for i in range(len(sizes))
    ]


def trained_mask(ctx: LossContext, role: str) -> torch.Tensor:
    """The tokens a loss of ``role`` may put gradient on: action tokens for a policy loss,
    action or observation tokens for an auxiliary loss."""
    if role == "policy":
        return ctx.action_mask != 0
    if role == "auxiliary":
        return (ctx.action_mask != 0) | (ctx.observation_mask != 0)
    raise ValueError(f"loss role {role!r} is not 'policy' or 'auxiliary'")


def _run(loss: Any, ctx: LossContext) -> tuple[LossOutput, torch.Tensor]:
    """Call the loss and return its output with the gradient on ``ctx.logprobs``."""
    out = loss(ctx)
    assert isinstance(out, LossOutput), (
        f"{type(loss).__name__} returned {type(out).__name__}; a loss returns LossOutput"
    )
    assert isinstance(out.loss, torch.Tensor), (
        f"LossOutput.loss is {type(out.loss).__name__}; it must be a torch tensor"
    )
    assert out.loss.requires_grad, (
        "LossOutput.loss does not require grad: it must be computed from ctx.logprobs"
    )
    (grad,) = torch.autograd.grad(out.loss, ctx.logprobs, allow_unused=True)
    assert grad is not None, "LossOutput.loss does not depend on ctx.logprobs"
    return out, grad


def _assert_finite(out: LossOutput, grad: torch.Tensor, case: str) -> None:
    assert out.loss.dim() == 0, f"{case}: loss has shape {tuple(out.loss.shape)}, expected 0-dim"
    assert torch.isfinite(out.loss).item(), f"{case}: loss is {out.loss.item()}"
    bad = (~torch.isfinite(grad)).nonzero().tolist()
    assert not bad, f"{case}: gradient on logprobs is not finite at [b, t] {bad[:8]}"


def _assert_no_leak(ctx: LossContext, grad: torch.Tensor, role: str, case: str) -> None:
    outside = ~trained_mask(ctx, role)
    leaked = (outside & (grad != 0)).nonzero().tolist()
    assert not leaked, (
        f"{case}: a {role} loss put gradient on untrained tokens at [b, t] {leaked[:8]};"
        " reduce through ctx.aggregate or multiply by the mask before reducing"
    )


def _assert_metrics(metrics: Mapping[str, float], *, finite: bool) -> None:
    assert isinstance(metrics, Mapping), f"metrics is {type(metrics).__name__}, not a mapping"
    for name, value in metrics.items():
        assert isinstance(name, str) and name, f"metric name {name!r} must be a non-empty str"
        assert isinstance(value, float), (
            f"metric {name!r} is {type(value).__name__}; report python floats (tensor.item())"
        )
        if finite:
            assert math.isfinite(value), f"metric {name!r} is {value}"


def _current_config(component: Any, spec: ComponentSpec) -> BaseModel:
    """The config the component was built with, when it keeps it as ``.config``; otherwise the
    spec's defaults."""
    config = getattr(component, "config", None)
    if isinstance(config, spec.config):
        return config
    try:
        return spec.validate_config({})
    except ValidationError as exc:
        pytest.fail(
            f"{spec.key}: its config has required keys and {type(component).__name__} keeps no"
            f" .config to round-trip; store the validated config on self.config ({exc})"
        )


def _assert_config_round_trips(spec: ComponentSpec, config: BaseModel) -> None:
    dumped = config.model_dump()
    assert spec.config.model_validate(dumped) == config, (
        f"{spec.key}: validating model_dump() of {config!r} gives a different config"
    )
    as_json = config.model_dump_json()
    assert spec.config.model_validate_json(as_json) == config, (
        f"{spec.key}: {as_json} does not validate back to the same config"
    )
    schema = spec.config.model_json_schema()
    assert schema.get("type") == "object", f"{spec.key}: JSON schema {schema} is not an object"
    json.dumps(schema)


def _assert_rejects_unknown_keys(spec: ComponentSpec) -> None:
    key = "surely_not_an_option"
    try:
        spec.validate_config({key: 1})
    except ValidationError:
        return
    pytest.fail(
        f"{spec.key}: config accepted the unknown key {key!r}; set"
        " model_config = ConfigDict(extra='forbid') so that plan typos are reported"
    )


def _require(spec: Any, fixture: str, expected: type[ComponentSpec]) -> None:
    if spec is None:
        pytest.skip(f"provide a {fixture!r} fixture returning the {expected.__name__} to run this")
    assert isinstance(spec, expected), (
        f"{fixture} is {type(spec).__name__}, not {expected.__name__}"
    )


@pytest.mark.rllm_conformance
class LossConformance:
    """The :class:`~rllm_core.ports.Loss` contract.

    Fixtures a subclass provides:

    - ``loss`` (required): a built loss instance.
    - ``loss_spec`` (optional): its :class:`~rllm_core.ComponentSpec`; enables the config tests and
      sets the role.
    - ``loss_role`` (optional): ``"policy"`` (default, or the spec's role) or ``"auxiliary"``. A
      policy loss may put gradient only on action tokens, an auxiliary loss only on action or
      observation tokens.
    """

    @pytest.fixture
    def loss(self) -> Any:
        pytest.fail(f"{type(self).__name__} must define a 'loss' fixture returning a built loss")

    @pytest.fixture
    def loss_spec(self) -> ComponentSpec | None:
        return None

    @pytest.fixture
    def loss_role(self, loss_spec: ComponentSpec | None) -> str:
        return loss_spec.trait("role") if loss_spec is not None else "policy"

    def test_returns_a_finite_scalar_and_float_metrics(self, loss: Any) -> None:
        ctx = make_loss_context()
        out, grad = _run(loss, ctx)
        _assert_finite(out, grad, "default context")
        assert out.loss.is_floating_point(), f"loss has dtype {out.loss.dtype}"
        _assert_metrics(out.metrics, finite=True)

    def test_zero_gradient_outside_trained_mask(self, loss: Any, loss_role: str) -> None:
        ctx = make_loss_context()
        _, grad = _run(loss, ctx)
        _assert_no_leak(ctx, grad, loss_role, "default context")
        trained = trained_mask(ctx, loss_role)
        assert grad[trained].abs().sum().item() > 0, (
            f"the {loss_role} loss puts no gradient on any trained token"
        )

    def test_a_loss_that_reads_no_observations_ignores_their_logprobs(self, loss: Any) -> None:
        if getattr(loss, "reads_observations", True):
            pytest.skip("the loss may read observation logprobs (reads_observations is not False)")
        ctx = make_loss_context()
        out, grad = _run(loss, ctx)
        outside = ctx.action_mask == 0
        moved = torch.where(outside, ctx.logprobs.detach() - 3.0, ctx.logprobs.detach())
        other = LossContext(
            aggregate=ctx.aggregate,
            **{name: getattr(ctx, name) for name in _TENSOR_FIELDS if name != "logprobs"},
            logprobs=moved.requires_grad_(),
        )
        other_out, other_grad = _run(loss, other)
        assert torch.allclose(other_out.loss, out.loss) and torch.allclose(other_grad, grad), (
            "reads_observations = False, yet the loss changed when logprobs outside the action"
            " mask did; a trainer leaves those at 0, so drop the attribute or stop reading them"
        )

    @pytest.mark.parametrize("log_ratio", [50.0, -50.0])
    def test_finite_for_extreme_log_ratios(
        self, loss: Any, loss_role: str, log_ratio: float
    ) -> None:
        ctx = make_loss_context(log_ratio=log_ratio)
        out, grad = _run(loss, ctx)
        case = f"logprobs - old_logprobs = {log_ratio}"
        _assert_finite(out, grad, case)
        _assert_no_leak(ctx, grad, loss_role, case)
        _assert_metrics(out.metrics, finite=False)

    @pytest.mark.parametrize("advantage", [1e4, -1e4])
    def test_finite_for_extreme_advantages(
        self, loss: Any, loss_role: str, advantage: float
    ) -> None:
        ctx = make_loss_context(advantage=advantage)
        out, grad = _run(loss, ctx)
        case = f"advantages = {advantage}"
        _assert_finite(out, grad, case)
        _assert_no_leak(ctx, grad, loss_role, case)

    def test_finite_for_zero_advantages_and_identical_logprobs(self, loss: Any) -> None:
        ctx = make_loss_context(advantage=0.0, log_ratio=0.0, rollout_drift=0.0)
        assert torch.equal(ctx.logprobs.detach(), ctx.rollout_logprobs)
        out, grad = _run(loss, ctx)
        _assert_finite(out, grad, "zero advantages, identical logprobs")

    def test_does_not_mutate_its_inputs(self, loss: Any) -> None:
        ctx = make_loss_context()
        before = {name: getattr(ctx, name).detach().clone() for name in _TENSOR_FIELDS}
        versions = {name: getattr(ctx, name)._version for name in _TENSOR_FIELDS}
        _run(loss, ctx)
        for name in _TENSOR_FIELDS:
            tensor = getattr(ctx, name)
            assert tensor._version == versions[name] and torch.equal(tensor, before[name]), (
                f"the loss modified ctx.{name} in place; compute on copies instead"
            )

    @pytest.mark.parametrize("mode", AGGREGATION_MODES)
    def test_every_aggregation_mode(self, loss: Any, loss_role: str, mode: str) -> None:
        ctx = make_loss_context(aggregation=mode)
        out, grad = _run(loss, ctx)
        _assert_finite(out, grad, f"aggregation {mode}")
        _assert_no_leak(ctx, grad, loss_role, f"aggregation {mode}")

    @pytest.mark.parametrize("mode", AGGREGATION_MODES)
    @pytest.mark.parametrize("sizes", [(2, 4), (1, 5)])
    def test_micro_batch_split_invariance(
        self, loss: Any, mode: str, sizes: tuple[int, ...]
    ) -> None:
        settings: dict[str, Any] = {
            "lengths": (7, 4, 9, 1, 5, 3),
            "seed": 3,
            "aggregation": mode,
            "dtype": torch.float64,
        }
        whole = make_loss_context(**settings)
        full, full_grad = _run(loss, whole)

        split = make_loss_context(**settings)
        summed = sum(loss(micro).loss for micro in split_loss_context(split, sizes))
        (split_grad,) = torch.autograd.grad(summed, split.logprobs)

        assert abs(summed.item() - full.loss.item()) <= 1e-6, (
            f"aggregation {mode}: micro-batches {sizes} sum to {summed.item()}, the whole"
            f" batch gives {full.loss.item()}; reduce through ctx.aggregate and keep no"
            " statistics across sequences"
        )
        torch.testing.assert_close(
            split_grad,
            full_grad,
            rtol=1e-6,
            atol=1e-6,
            msg=lambda text: f"aggregation {mode}, micro-batches {sizes}: gradients differ\n{text}",
        )

    def test_config_round_trip(self, loss: Any, loss_spec: ComponentSpec | None) -> None:
        _require(loss_spec, "loss_spec", ComponentSpec)
        assert loss_spec is not None
        config = _current_config(loss, loss_spec)
        _assert_config_round_trips(loss_spec, config)

        rebuilt = loss_spec.build(config.model_dump(mode="json"))
        ctx = make_loss_context()
        expected = loss(ctx).loss.item()
        assert rebuilt(ctx).loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-12), (
            f"{loss_spec.key} rebuilt from {config.model_dump(mode='json')} computes a different"
            " loss"
        )

    def test_config_rejects_unknown_keys(self, loss_spec: ComponentSpec | None) -> None:
        _require(loss_spec, "loss_spec", ComponentSpec)
        assert loss_spec is not None
        _assert_rejects_unknown_keys(loss_spec)


def _case_id(case: tuple[str, Mapping[str, Any]]) -> str:
    name, options = case
    return name + "".join(f"-{key}={value}" for key, value in sorted(options.items()))


def loss_conformance_cases(
    specs: Iterable[ComponentSpec], cases: Sequence[tuple[str, Mapping[str, Any]]]
) -> type[LossConformance]:
    """A :class:`LossConformance` run once per case: ``(name, options)`` builds the spec named
    ``name`` among ``specs`` from ``options``. Test ids read ``name-key=value...``.

    A plugin's test module subclasses the returned class (the subclass's ``Test`` name is what
    pytest collects).
    """
    by_name = {spec.name: spec for spec in specs}
    unknown = sorted({name for name, _ in cases} - by_name.keys())
    if unknown:
        raise ValueError(f"cases name losses {unknown} not among the specs {sorted(by_name)}")

    class _LossCases(LossConformance):
        @pytest.fixture(params=list(cases), ids=_case_id)
        def loss_case(self, request: pytest.FixtureRequest) -> tuple[str, Mapping[str, Any]]:
            return request.param

        @pytest.fixture
        def loss_spec(self, loss_case: tuple[str, Mapping[str, Any]]) -> ComponentSpec:
            return by_name[loss_case[0]]

        @pytest.fixture
        def loss(self, loss_spec: ComponentSpec, loss_case: tuple[str, Mapping[str, Any]]) -> Any:
            return loss_spec.build(loss_case[1])

    return _LossCases


_RAGGED_GROUPS = [[1.0, 0.0, 1.0, 0.0], [0.5], [2.0, 2.0, 2.0], [0.0, 1.0], [3.0, -1.0, 0.25, 7.5]]

_HARD_GROUPS = {
    "groups of size 1": [[1.0], [0.0], [-3.5]],
    "all-equal groups": [[1.0, 1.0, 1.0], [0.0, 0.0], [-2.5, -2.5, -2.5, -2.5]],
    "huge rewards": [[1e12, -1e12, 3e11], [1e15, 1e15 + 2.0], [-1e12]],
    "tiny rewards": [[1e-30, 2e-30, 0.0], [-1e-30, 1e-30], [5e-324, 0.0]],
}


@pytest.mark.rllm_conformance
class AdvantageEstimatorConformance:
    """The :class:`~rllm_core.ports.AdvantageEstimator` contract.

    Fixtures a subclass provides:

    - ``estimator`` (required): a built estimator.
    - ``estimator_spec`` (optional): its :class:`~rllm_core.ComponentSpec`; enables
      the config tests.

    A group of size 1 counts as neither zero-variance nor not: the suite leaves that to the
    estimator and only checks groups of two or more in ``zero_variance_groups``.
    """

    @pytest.fixture
    def estimator(self) -> Any:
        pytest.fail(
            f"{type(self).__name__} must define an 'estimator' fixture returning a built"
            " advantage estimator"
        )

    @pytest.fixture
    def estimator_spec(self) -> ComponentSpec | None:
        return None

    @staticmethod
    def _compute(estimator: Any, rewards: Any, case: str) -> AdvantageResult:
        result = estimator.compute(rewards)
        assert isinstance(result, AdvantageResult), (
            f"{case}: compute returned {type(result).__name__}; return AdvantageResult"
        )
        shape = [len(group) for group in result.advantages]
        expected = [len(group) for group in rewards]
        assert shape == expected, f"{case}: advantages have group sizes {shape}, not {expected}"
        for g, group in enumerate(result.advantages):
            for i, value in enumerate(group):
                assert isinstance(value, float), (
                    f"{case}: advantages[{g}][{i}] is {type(value).__name__}; use python floats"
                )
                assert math.isfinite(value), f"{case}: advantages[{g}][{i}] is {value}"
        count = result.zero_variance_groups
        assert isinstance(count, int) and not isinstance(count, bool), (
            f"{case}: zero_variance_groups is {count!r}, not an int"
        )
        _assert_metrics(result.metrics, finite=True)
        return result

    def test_shape_matches_ragged_groups(self, estimator: Any) -> None:
        self._compute(estimator, copy.deepcopy(_RAGGED_GROUPS), "ragged groups")

    @pytest.mark.parametrize("case", sorted(_HARD_GROUPS))
    def test_finite_for_hard_groups(self, estimator: Any, case: str) -> None:
        self._compute(estimator, copy.deepcopy(_HARD_GROUPS[case]), case)

    def test_pure(self, estimator: Any) -> None:
        rewards = copy.deepcopy(_RAGGED_GROUPS)
        first = self._compute(estimator, rewards, "first call")
        assert rewards == _RAGGED_GROUPS, (
            f"compute modified its input: {_RAGGED_GROUPS} became {rewards}"
        )
        second = self._compute(estimator, rewards, "second call")
        as_tuples = self._compute(
            estimator, tuple(tuple(group) for group in rewards), "tuple input"
        )
        for other, label in ((second, "a second call"), (as_tuples, "the same rewards as tuples")):
            assert other.advantages == first.advantages, (
                f"{label} gave {other.advantages}, the first call {first.advantages}"
            )
            assert other.zero_variance_groups == first.zero_variance_groups

    @pytest.mark.parametrize(
        ("rewards", "expected"),
        [
            ([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.5, 0.5], [2.0, 2.0, 2.0, 2.0], [1.0, 0.0]], 3),
            ([[0.0, 1.0], [1.0, 2.0, 3.0]], 0),
            ([[0.0, 0.0], [-1.0, -1.0]], 2),
        ],
    )
    def test_zero_variance_groups_counted_exactly(
        self, estimator: Any, rewards: list[list[float]], expected: int
    ) -> None:
        result = self._compute(estimator, copy.deepcopy(rewards), "zero-variance count")
        assert result.zero_variance_groups == expected, (
            f"rewards {rewards} have {expected} all-equal groups, the estimator counted"
            f" {result.zero_variance_groups}"
        )

    def test_config_round_trip(self, estimator: Any, estimator_spec: ComponentSpec | None) -> None:
        _require(estimator_spec, "estimator_spec", ComponentSpec)
        assert estimator_spec is not None
        config = _current_config(estimator, estimator_spec)
        _assert_config_round_trips(estimator_spec, config)

        rebuilt = estimator_spec.build(config.model_dump(mode="json"))
        rewards = copy.deepcopy(_RAGGED_GROUPS)
        assert rebuilt.compute(rewards).advantages == estimator.compute(rewards).advantages, (
            f"{estimator_spec.key} rebuilt from {config.model_dump(mode='json')} computes"
            " different advantages"
        )

    def test_config_rejects_unknown_keys(self, estimator_spec: ComponentSpec | None) -> None:
        _require(estimator_spec, "estimator_spec", ComponentSpec)
        assert estimator_spec is not None
        _assert_rejects_unknown_keys(estimator_spec)
