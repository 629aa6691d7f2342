"""Names other frameworks give to the losses and advantage estimators provided here.

Users bring names from verl, TRL, rLLM and prime-rl (``vanilla``, ``dr_grpo``,
``importance_sampling``). This table is used only to word the hint of an unknown-component
error, never to resolve a name: a plan that says ``ppo`` still fails, and the message names the
installed component that computes the same thing (``did you mean 'ppo-clip' (verl: vanilla;
rLLM: ppo)?``) or says that none does. ``rllm-core docs write`` renders it as
:data:`ALIASES_PAGE`, and a test checks that every component it names is a first-party one.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm_core.plugins.catalog import known_provider
from rllm_core.plugins.specs import Kind, canonical_name

__all__ = [
    "ALIASES",
    "ALIASES_PAGE",
    "Alias",
    "AliasHint",
    "alias_hint",
    "aliases_for",
    "aliases_markdown",
    "squash",
]

ALIASES_PAGE = Path("docs/plugins/aliases.md")


@dataclass(frozen=True, eq=False)
class Alias:
    """One name as another framework spells it, and what computes the same thing here.

    ``target`` is the component here, ``options`` its options and ``plan`` the other
    ``[algorithm]`` keys that make it the same computation. ``target`` is None when nothing here
    is equivalent; ``nearest`` then names the closest component and ``note`` how it differs.
    """

    kind: Kind
    name: str
    framework: str
    key: str
    target: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    plan: Mapping[str, Any] = field(default_factory=dict)
    nearest: str | None = None
    note: str = ""

    def same_as_here(self) -> bool:
        """The name is spelled as here and needs no settings: it resolves as it is."""
        return canonical_name(self.name) == self.target and not self.options and not self.plan

    def setting(self) -> str:
        """The target with the settings that make it equivalent, as a hint writes it."""
        parts = [f"{key} = {_toml(value)}" for key, value in self.options.items()]
        parts += [f"[algorithm].{key} = {_toml(value)}" for key, value in self.plan.items()]
        return f"{self.target!r}" + (" with " + " and ".join(parts) if parts else "")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


_VERL_LOSS = "actor.policy_loss.loss_mode"
_VERL_ADV = "algorithm.adv_estimator"
_TRL_LOSS = "GRPOConfig.loss_type"
_RLLM_LOSS = "algorithm.loss_fn"
_RLLM_ADV = "algorithm.adv_estimator"
_PRIME_LOSS = "loss.type"
_PRIME_ALGO = "algo.type"

_L = Kind.LOSS
_A = Kind.ADVANTAGE_ESTIMATOR

ALIASES: tuple[Alias, ...] = (
    # ------------------------------------------------------------ policy losses
    Alias(_L, "vanilla", "verl", _VERL_LOSS, "ppo-clip",
          note="verl always applies the dual clip (`clip_ratio_c = 3.0`); set"
          " `dual_clip_c = 3.0` for the same"),
    Alias(_L, "gspo", "verl", _VERL_LOSS, "gspo"),
    Alias(_L, "cispo", "verl", _VERL_LOSS, "cispo",
          note="verl takes the bounds from the actor's clip ratios (0.2 / 0.2)"),
    Alias(_L, "dppo_tv", "verl", _VERL_LOSS, "dppo-tv"),
    Alias(_L, "dppo_kl", "verl", _VERL_LOSS, "dppo-kl"),
    Alias(_L, "gpg", "verl", _VERL_LOSS, nearest="reinforce",
          note="GPG's loss is `-A * logprobs` with no importance ratio, where `reinforce`"
          " weights by `sg(ratio)`, which is 1 on policy"),
    Alias(_L, "clip_cov", "verl", _VERL_LOSS, note="covariance-selected clipping"),
    Alias(_L, "kl_cov", "verl", _VERL_LOSS, note="covariance-selected KL penalty"),
    Alias(_L, "geo_mean", "verl", _VERL_LOSS, note="GMPO: geometric mean of token ratios"),
    Alias(_L, "sapo", "verl", _VERL_LOSS, note="a soft gate in place of the clip"),
    Alias(_L, "grpo", "TRL", _TRL_LOSS, "ppo-clip", plan={"aggregation": "seq-mean-token-mean"}),
    Alias(_L, "bnpo", "TRL", _TRL_LOSS, "ppo-clip", plan={"aggregation": "token-mean"},
          note="TRL counts the tokens of the local batch, here of the whole optimizer step"),
    Alias(_L, "dapo", "TRL", _TRL_LOSS, "ppo-clip", plan={"aggregation": "token-mean"},
          note="DAPO's clip-higher is `eps_high = 0.28`"),
    Alias(_L, "dr_grpo", "TRL", _TRL_LOSS, "ppo-clip",
          plan={"aggregation": "seq-mean-token-sum-norm"},
          note="`norm_length` is TRL's `max_completion_length`"),
    Alias(_L, "cispo", "TRL", _TRL_LOSS, "cispo"),
    Alias(_L, "sapo", "TRL", _TRL_LOSS, note="a soft gate in place of the clip"),
    Alias(_L, "luspo", "TRL", _TRL_LOSS, note="GSPO scaled by each sequence's length"),
    Alias(_L, "ppo", "rLLM", _RLLM_LOSS, "ppo-clip"),
    Alias(_L, "importance_sampling", "rLLM", _RLLM_LOSS, "reinforce",
          note="the same gradient, `-A * ratio`, with `ratio_cap` unset"),
    Alias(_L, "cispo", "rLLM", _RLLM_LOSS, "cispo"),
    Alias(_L, "dro", "rLLM", _RLLM_LOSS,
          note="an off-policy objective with a quadratic log-ratio penalty"),
    Alias(_L, "default", "prime-rl", _PRIME_LOSS, nearest="dppo-tv",
          note="DPPO with a binary-TV mask, to which prime-rl adds `kl_tau * log_ratio**2`"
          " and masks at 0.2, which is `delta = 0.2`"),
    Alias(_L, "ipo", "prime-rl", _PRIME_LOSS),
    # ------------------------------------------------------------ advantage estimators
    Alias(_A, "grpo", "verl", _VERL_ADV, "grpo",
          note="`norm_adv_by_std_in_grpo = false` is `normalize_std = false`"),
    Alias(_A, "grpo_vectorized", "verl", _VERL_ADV, "grpo"),
    Alias(_A, "rloo", "verl", _VERL_ADV, "rloo"),
    Alias(_A, "rloo_vectorized", "verl", _VERL_ADV, "rloo"),
    Alias(_A, "reinforce_plus_plus_baseline", "verl", _VERL_ADV,
          "reinforce-plus-plus-baseline",
          note="verl whitens over tokens, so a longer response weighs more in the batch"
          " statistics"),
    Alias(_A, "reinforce_plus_plus", "verl", _VERL_ADV, nearest="prpo",
          note="discounted returns whitened over the batch's tokens with no group baseline,"
          " where `prpo` normalises per sequence"),
    Alias(_A, "gae", "verl", _VERL_ADV,
          note="it needs a value model, and rllm-core trains no critic"),
    Alias(_A, "remax", "verl", _VERL_ADV, note="its baseline is a greedy rollout's reward"),
    Alias(_A, "opo", "verl", _VERL_ADV,
          note="its baseline is the length-weighted mean reward of the group"),
    Alias(_A, "grpo_passk", "verl", _VERL_ADV,
          note="only the best rollout of a group gets an advantage"),
    Alias(_A, "gpg", "verl", _VERL_ADV),
    Alias(_A, "optimal_token_baseline", "verl", _VERL_ADV),
    Alias(_A, "dr_grpo", "Dr. GRPO paper", "verl `norm_adv_by_std_in_grpo = false`, TRL"
          ' `scale_rewards = "none"`', "grpo", options={"normalize_std": False}),
    Alias(_A, "grpo", "rLLM", _RLLM_ADV, "grpo", options={"std": "population"},
          note="rLLM divides by numpy's `std`, the population one"),
    Alias(_A, "reinforce", "rLLM", _RLLM_ADV, "reinforce"),
    Alias(_A, "reinforce_plus_plus_baseline", "rLLM", _RLLM_ADV, "reinforce-plus-plus-baseline",
          options={"std": "population"}),
    Alias(_A, "prpo", "rLLM", _RLLM_ADV, "prpo", options={"std": "population"}),
    Alias(_A, "rloo", "rLLM", _RLLM_ADV, "rloo",
          note="rLLM gives a group of one its reward, here 0"),
    Alias(_A, "grpo", "prime-rl", _PRIME_ALGO, "grpo", options={"normalize_std": False},
          note="prime-rl subtracts the group mean and does not divide by the std"),
    Alias(_A, "max_rl", "prime-rl", _PRIME_ALGO,
          note="it divides the centred reward by the group mean"),
)  # fmt: skip
"""Every alias, in the order the documentation page lists them."""


def squash(name: str) -> str:
    """``name`` lowercased with ``+`` spelled ``plus`` and every other non-alphanumeric dropped,
    so ``PPO.clip``, ``ppoclip`` and ``ppo_clip`` compare equal and ``reinforce++`` stays
    distinct from ``reinforce``."""
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("+", "plus"))


def aliases_for(kind: Kind | str, name: str) -> list[Alias]:
    """The aliases of ``kind`` spelled ``name`` in some framework, compared after
    :func:`squash`."""
    kind = Kind(kind)
    key = squash(name)
    return [alias for alias in ALIASES if alias.kind is kind and squash(alias.name) == key]


@dataclass(frozen=True, slots=True)
class AliasHint:
    """What to tell a user who named ``kind:name``: ``suggestion`` is the component to try
    (None when nothing here is equivalent) and ``text`` the whole hint clause."""

    suggestion: str | None
    text: str


def alias_hint(kind: Kind | str, name: str, available: Collection[str]) -> AliasHint | None:
    """The hint for an unknown ``kind:name`` that another framework uses, or None.

    ``available`` are the installed names of ``kind``; a suggested component that is not among
    them is named with its first-party distribution to install.
    """
    kind = Kind(kind)
    matched = [
        alias
        for alias in aliases_for(kind, name)
        if not alias.same_as_here() and alias.target != canonical_name(name)
    ]
    if not matched:
        return None
    what = kind.value.replace("_", " ")
    clauses: list[str] = []
    notes: list[str] = []
    settings: set[str] = set()
    suggestion = None
    for alias in matched:
        if alias.target is None:
            text = f"{alias.framework}'s {alias.name} {what} has no rllm-core equivalent"
            if alias.nearest:
                install = _install(kind, alias.nearest, available)
                text += f"; the nearest is {alias.nearest!r}{install}"
            if alias.note:
                text += ": " + alias.note.replace("`", "")
            notes.append(text)
            continue
        setting = alias.setting()
        if setting in settings:
            continue
        settings.add(setting)
        known_as = _known_as(kind, setting)
        clauses.append(
            setting
            + (f" ({known_as})" if known_as else "")
            + _install(kind, alias.target, available)
        )
        suggestion = suggestion or alias.target
    parts = ["did you mean " + " or ".join(clauses) + "?"] if clauses else []
    return AliasHint(suggestion=suggestion, text="; ".join(parts + notes))


def _known_as(kind: Kind, setting: str) -> str:
    """``verl: vanilla; rLLM: ppo``: every other framework's name for ``setting``."""
    names: dict[str, list[str]] = {}
    for alias in ALIASES:
        if alias.kind is not kind or alias.target is None or alias.setting() != setting:
            continue
        if not alias.same_as_here():
            names.setdefault(alias.framework, []).append(alias.name)
    return "; ".join(f"{framework}: {', '.join(spelled)}" for framework, spelled in names.items())


def _install(kind: Kind, name: str, available: Collection[str]) -> str:
    if name in available:
        return ""
    provider = known_provider(kind, name)
    return f", from {provider} (pip install {provider})" if provider else ""


_PAGE_INTRO = """\
# Names from other frameworks

<!-- Generated by `rllm-core docs write` from rllm_core/plugins/aliases.py. -->

Losses and advantage estimators that verl, TRL, rLLM and prime-rl call by other names, and the
component here that computes the same thing. A plan must use the names here; when it names one
of these instead, `plan check`, `run`, `eval` and `sft` fail with a hint drawn from this table:

```
no loss named 'vanilla' is installed; did you mean 'ppo-clip' (verl: vanilla; rLLM: ppo)?
```

A name that differs from one here only in case, `_` or `-` is the same name (`DPPO_TV` is
`dppo-tv`). Rows whose name is also a name here give the settings that reproduce the other
framework's defaults."""


def aliases_markdown() -> str:
    """The documentation page of :data:`ALIASES`."""
    lines = [_PAGE_INTRO]
    for kind, title in ((Kind.LOSS, "Losses"), (Kind.ADVANTAGE_ESTIMATOR, "Advantage estimators")):
        lines += [
            "",
            f"## {title}",
            "",
            "| name | framework | set there as | here | notes |",
            "| --- | --- | --- | --- | --- |",
        ]
        for alias in (a for a in ALIASES if a.kind is kind):
            if alias.target is not None:
                here = f"`{alias.target}`"
                settings = [f"`{k} = {_toml(v)}`" for k, v in alias.options.items()]
                settings += [f"`[algorithm].{k} = {_toml(v)}`" for k, v in alias.plan.items()]
                if settings:
                    here += " with " + ", ".join(settings)
            else:
                here = "none"
                if alias.nearest:
                    here += f" (nearest: `{alias.nearest}`)"
            key = alias.key if "`" in alias.key else f"`{alias.key}`"
            note = alias.note.replace("|", "\\|")
            lines.append(f"| `{alias.name}` | {alias.framework} | {key} | {here} | {note} |")
    return "\n".join(lines) + "\n"
