"""Loss kernels a managed training service runs itself, and the choice between them and the
client-side (custom) path.

Tinker and Fireworks train a custom loss in two passes: a forward pass returns the logprobs,
the loss runs on this machine, and its gradient goes back for a second pass
(``forward_backward_custom``). Both also run a few policy losses server-side in one fused pass
(``forward_backward(data, loss_fn, loss_fn_config)``), on the wire contract they share: each
datum carries ``target_tokens``, the sampler's ``logprobs`` and per-token ``advantages``, and
the kernel returns the sum over every token of

- ``importance_sampling``: ``-r * A``,
- ``ppo``: ``-min(r * A, clip(r, clip_low_threshold, clip_high_threshold) * A)``,
- ``cispo``: ``-sg(clip(r, clip_low_threshold, clip_high_threshold)) * A * logp``,

with ``r = exp(logp - sampler_logprobs)`` and ``sg`` stopping the gradient. Each of these is
linear in ``A`` with a positive factor, so the plan's aggregation (token-mean and the
per-sequence modes) folds into the advantages: each action token's advantage is multiplied by
the weight the aggregation gives it (:func:`aggregation_weights`) and every other token's is
0. The kernel then computes the objective the loss computes client-side, with the same
gradient.

A loss says whether it has such a form through its config: a config with a ``native_loss()``
method returns a :class:`NativeLoss` (the kernel and its ratio bounds, from the loss's own
hyperparameters) or a sentence saying why not. :func:`route` decides, for a service and the
kernels its installed SDK lists, whether a plan's objective runs natively: only the policy
loss, without auxiliary losses or rollout corrections (both need the current logprobs on this
machine), and with the sampler's logprobs as the ratio's denominator.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rllm_core.ports.losses import NATIVE_KERNELS, NativeLoss

__all__ = [
    "LOSS_PATHS",
    "LOSS_PATH_FILE",
    "NATIVE_KERNELS",
    "LossRoute",
    "NativeLoss",
    "NativeLossError",
    "NativeLossSettings",
    "aggregation_weights",
    "native_form",
    "route",
    "route_objective",
]

LOSS_PATHS: tuple[str, ...] = ("auto", "native", "custom")
"""The values of ``[trainer].loss_path``."""

LOSS_PATH_FILE = "loss_path.json"
"""The file of the run folder that records the path a run's trainer chose, and why."""


class NativeLossError(ValueError):
    """``loss_path = "native"`` asked for a loss the service cannot run natively."""


class NativeLossSettings(BaseModel):
    """The ``loss_path`` key of a managed trainer backend's config."""

    loss_path: Literal["auto", "native", "custom"] = Field(
        "auto",
        description=(
            "Where the plan's loss runs. 'auto': in the service's fused kernel when the loss,"
            " auxiliary losses and rollout corrections can all be expressed there (one pass),"
            " else on this machine through forward_backward_custom (two passes). 'native':"
            " the service's kernel, refused at plan check when the loss has none. 'custom':"
            " always on this machine. The choice and its reason are printed at start and"
            " written to loss_path.json in the run folder."
        ),
    )


@dataclass(frozen=True)
class LossRoute:
    """The path a backend trains the plan's objective on, and why.

    ``path`` is ``"native"`` or ``"custom"``; ``requested`` is ``[trainer].loss_path``;
    ``kernel`` and ``config`` are the service's loss name and ``loss_fn_config`` on the native
    path (``None`` and empty on the custom one).
    """

    path: Literal["native", "custom"]
    requested: str
    service: str
    loss: str
    reason: str
    kernel: str | None = None
    config: Mapping[str, float] = field(default_factory=dict)

    def line(self) -> str:
        """The start-up line, such as ``loss path: native (tinker 'ppo', clip_low_threshold=0.8,
        clip_high_threshold=1.2): ...``."""
        if self.path == "native":
            params = "".join(f", {k}={v:g}" for k, v in self.config.items())
            where = f"native ({self.service} {self.kernel!r}{params})"
        else:
            where = f"custom ({self.service} forward_backward_custom)"
        return f"loss path: {where}, loss_path = {self.requested!r}: {self.reason}"

    def record(self) -> dict[str, Any]:
        """The JSON object written to :data:`LOSS_PATH_FILE`."""
        return {
            "path": self.path,
            "requested": self.requested,
            "service": self.service,
            "loss": self.loss,
            "kernel": self.kernel,
            "loss_fn_config": dict(self.config),
            "reason": self.reason,
        }

    def write(self, run_folder: str | Path) -> Path:
        """Write :meth:`record` to ``<run_folder>/loss_path.json``; returns the file."""
        path = Path(run_folder) / LOSS_PATH_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.record(), indent=2, sort_keys=True) + "\n")
        return path


def native_form(loss_name: str, config: Any) -> NativeLoss | str:
    """The server-side form of loss ``loss_name`` with ``config`` (its validated config model),
    or the reason it has none."""
    method = getattr(config, "native_loss", None)
    if not callable(method):
        return f"loss {loss_name!r} declares no server-side form"
    form = method()
    if not isinstance(form, NativeLoss | str):
        raise TypeError(
            f"{type(config).__name__}.native_loss() returned {type(form).__name__}; it returns a"
            " NativeLoss or a str saying why the loss has no server-side form"
        )
    if isinstance(form, str):
        return f"loss {loss_name!r}: {form}"
    return form


def route(
    *,
    service: str,
    available: Collection[str],
    requested: str,
    loss_name: str,
    loss_config: Any,
    aux_losses: Sequence[str] = (),
    corrections: Sequence[str] = (),
    proximal: str = "rollout",
) -> LossRoute:
    """Choose the path for a plan's objective on ``service``, whose installed SDK lists the
    kernels ``available``.

    ``aux_losses`` names the auxiliary losses with a nonzero coefficient and ``corrections``
    the rollout corrections that are set (``tis_cap``, ``mask``). Raises
    :class:`NativeLossError`, with the reason, when ``requested`` is ``"native"`` and the
    objective cannot run natively; ``requested`` must be one of :data:`LOSS_PATHS`.
    """
    if requested not in LOSS_PATHS:
        raise ValueError(f"loss_path must be one of {', '.join(LOSS_PATHS)}, not {requested!r}")

    def custom(reason: str) -> LossRoute:
        if requested == "native":
            raise NativeLossError(
                f"loss_path = 'native', but {service} cannot run this objective in its own"
                f" kernel: {reason}"
            )
        return LossRoute("custom", requested, service, loss_name, reason)

    if requested == "custom":
        return custom("forced by loss_path = 'custom'")
    if aux_losses:
        return custom(
            f"auxiliary loss {', '.join(repr(a) for a in aux_losses)} has no server-side"
            " kernel (a service kernel computes the policy loss alone)"
        )
    if corrections:
        return custom(
            f"rollout correction {', '.join(corrections)} weighs tokens by the current"
            " policy's ratio, which only the custom path sees before the backward pass"
        )
    if proximal != "rollout":
        return custom(
            f"proximal = {proximal!r}; the service's kernels take the sampler's logprobs as the"
            " ratio's denominator"
        )
    form = native_form(loss_name, loss_config)
    if isinstance(form, str):
        return custom(form)
    if form.kernel not in available:
        return custom(
            f"loss {loss_name!r} runs as the {form.kernel!r} kernel, which the installed"
            f" {service} SDK does not list (it lists {', '.join(sorted(available)) or 'none'})"
        )
    reason = f"loss {loss_name!r} is the service's {form.kernel!r} kernel"
    if requested == "native":
        reason += " (forced by loss_path = 'native')"
    return LossRoute(
        "native", requested, service, loss_name, reason, form.kernel, form.loss_fn_config()
    )


def route_objective(
    objective: Any, *, service: str, available: Collection[str], requested: str
) -> LossRoute:
    """:func:`route` for a built :class:`~rllm_core.algorithms.objective.Objective`: the
    policy loss's config is the loss object's ``config`` attribute."""
    correction = objective.correction
    corrections = []
    if correction.tis_cap is not None:
        corrections.append("tis_cap")
    if correction.mask_low is not None:
        corrections.append("mask_low/mask_high")
    return route(
        service=service,
        available=available,
        requested=requested,
        loss_name=objective.policy.name,
        loss_config=getattr(objective.policy.loss, "config", None),
        aux_losses=[term.name for term in objective.terms[1:]],
        corrections=corrections,
        proximal=objective.proximal,
    )


def aggregation_weights(
    mode: str, action_masks: Sequence[Sequence[bool]], *, norm_length: float | None = None
) -> list[list[float]]:
    """Each token's weight in the plan's aggregation over one call's datums: the factor by
    which ``ctx.aggregate`` multiplies an action token's value (0 elsewhere), so that the sum
    of ``weight * value`` over every token equals the aggregate. The counts are those of
    :func:`~rllm_core.algorithms.aggregation.step_normalizers` over the whole call."""
    from rllm_core.algorithms.aggregation import AGGREGATION_MODES

    if mode not in AGGREGATION_MODES:
        raise ValueError(
            f"unknown aggregation mode {mode!r}; valid: {', '.join(AGGREGATION_MODES)}"
        )
    counts = [sum(1 for m in mask if m) for mask in action_masks]
    tokens = sum(counts)
    sequences = sum(1 for count in counts if count)
    out = []
    for mask, count in zip(action_masks, counts, strict=True):
        if mode == "token-mean":
            weight = 1.0 / max(tokens, 1)
        elif mode == "seq-mean-token-mean":
            weight = 1.0 / (max(count, 1) * max(sequences, 1))
        elif mode == "seq-mean-token-sum":
            weight = 1.0 / max(sequences, 1)
        else:
            if norm_length is None:
                raise ValueError("aggregation mode 'seq-mean-token-sum-norm' needs norm_length")
            weight = 1.0 / (max(sequences, 1) * norm_length)
        out.append([weight if m else 0.0 for m in mask])
    return out
