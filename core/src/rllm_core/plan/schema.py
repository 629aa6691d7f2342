"""The ``plan.toml`` schema: the sections and keys the core itself understands.

Component sections (``[trainer]``, ``[renderer]``, ``[sandbox]`` ...) hold ``name`` plus the
component's own keys; those keys are validated against the component's config schema once the
name is resolved to an installed plugin (see :mod:`rllm_core.plan.resolve`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

from rllm_core.algorithms.aggregation import AGGREGATION_MODES
from rllm_core.docs_site import docs_page
from rllm_core.plugins.specs import Kind, PlanPath, canonical_name
from rllm_core.types import Termination

__all__ = [
    "AggregationMode",
    "BUILTIN_LAUNCHERS",
    "COMPONENT_SECTIONS",
    "AlgorithmSection",
    "CorrectionSection",
    "KLSection",
    "KL_ESTIMATORS",
    "OverlongSection",
    "ComponentRef",
    "Plan",
    "RolloutSection",
    "RunSection",
    "SamplingSection",
    "SchedulerSection",
    "SftSection",
    "component_section",
    "component_sections",
    "waiting_groups_bound",
]

AggregationMode = Literal[AGGREGATION_MODES]  # type: ignore[valid-type]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ComponentRef(BaseModel):
    """``name`` of an installed component plus that component's own keys.

    Written either as a table (``[sandbox]`` / ``name = "local"`` / ``memory_mb = 4096``) or,
    where a section key selects a component, as a bare string (``loss = "dppo-tv"``).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(description="Name of the component, as listed by `rllm-core plugins`.")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"name": value}
        return value

    @property
    def options(self) -> dict[str, Any]:
        """The component's own keys (everything but ``name``)."""
        return dict(self.model_extra or {})


class RunSection(_Section):
    name: str = Field(
        "run", description="Run name; the run folder is `<output_dir>/<name>-<timestamp>`."
    )
    seed: int = Field(0, description="Seed for data order, sampling and initialization.")
    steps: int = Field(10, ge=1, description="Number of training steps.")
    output_dir: str = Field("runs", description="Folder that receives run folders.")
    save_every: int = Field(
        0, ge=0, description="Save a checkpoint every N steps (0: only at the end)."
    )
    pipeline: Literal["sync", "async"] = Field(
        "sync",
        description=(
            "`sync`: each step samples, then trains on what it sampled (the async pipeline"
            " with a lead of 0: `max_policy_age = 0`). `async`: rollouts keep running into a"
            " bounded queue while the trainer trains, and `[algorithm].max_policy_age` bounds"
            " how old the policy behind a trained sample may be."
        ),
    )
    eval_every: int = Field(
        0,
        ge=0,
        description=(
            "Evaluate the current policy on the task source's eval split every N steps and"
            " after the last (0: never), through the run's gateway and sampler; writes `eval/*`"
            " metrics."
        ),
    )
    eval_attempts: int = Field(
        1, ge=1, description="Attempts per eval task (pass@k is reported for k up to this)."
    )
    keep_best: str | None = Field(
        None,
        description=(
            "An `eval/*` metric (`eval/pass@1`): the checkpoint of the evaluation where it was"
            " highest is kept in `checkpoints/best/` besides the latest (needs `eval_every`)."
        ),
    )
    export: Annotated[str | None, PlanPath()] = Field(
        None,
        description=(
            "When the run finishes, write the trained policy as a standalone model folder here"
            " (LoRA merged into the base weights), for another plan's `[trainer].model` or"
            " distillation teacher to name. Not written for an interrupted or failed run."
        ),
    )
    deterministic: bool = Field(
        True,
        description=(
            "Bitwise repeatable results: the same plan and seed on the same machine type, thread"
            " count and library versions write the same metrics and weights, and a resumed run"
            " equals an uninterrupted one. Sets the numerical libraries' reproducible modes"
            " (MKL_CBWR=AUTO,STRICT unless already set) and the trainer's deterministic"
            " switches. false leaves them at their defaults."
        ),
    )


class CorrectionSection(_Section):
    tis_cap: float | None = Field(
        None,
        gt=0.0,
        description=(
            "Truncated importance sampling: weigh each sampled token by min(trainer / sampler"
            " probability ratio, tis_cap), without gradient (unset: off)."
        ),
    )
    mask_low: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description=(
            "IcePop masking: tokens whose trainer / sampler ratio is below this get no gradient"
            " (set with mask_high; unset: off)."
        ),
    )
    mask_high: float | None = Field(
        None,
        gt=1.0,
        description="IcePop masking: tokens whose trainer / sampler ratio is above this get no"
        " gradient (set with mask_low).",
    )

    @model_validator(mode="after")
    def _both_bounds(self) -> CorrectionSection:
        if (self.mask_low is None) != (self.mask_high is None):
            raise ValueError("set both mask_low and mask_high (the ratio range kept), or neither")
        return self


KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "low-var-kl")
"""Per-token estimators of KL(policy || reference) from ``log r = logprob - ref_logprob``:
``k1`` is ``log r``, ``k2`` is ``(log r)**2 / 2``, ``k3`` is ``exp(-log r) - 1 + log r`` and
``low-var-kl`` is ``k3`` with ``log r`` clamped to +-20 and the result to +-10 (verl's
``low_var_kl``)."""


class KLSection(_Section):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True
    )

    coef: float = Field(
        0.0, ge=0.0, description="Weight of the KL to the reference model (0: off)."
    )
    estimator: Literal[KL_ESTIMATORS] = Field(  # type: ignore[valid-type]
        "low-var-kl",
        description=(
            "Per-token KL estimator: `k1` (log ratio), `k2` (half its square), `k3` or"
            " `low-var-kl` (k3 clamped, as verl's `low_var_kl`)."
        ),
    )
    apply_in: Literal["loss", "reward"] = Field(
        "loss",
        alias="in",
        description=(
            "`loss`: the KL is a term of the objective, with its gradient; `reward`: it is"
            " subtracted from each sampled token's advantage, without gradient (a KL penalty"
            " in the reward)."
        ),
    )

    @property
    def active(self) -> bool:
        return self.coef > 0


class OverlongSection(_Section):
    mode: Literal["off", "mask", "soft"] = Field(
        "off",
        description=(
            "Completions cut at `[sampling].max_tokens` (finish reason `length`): `mask` leaves"
            " their episodes' tokens out of the loss; `soft` lowers the reward linearly over the"
            " last `buffer_tokens` before the limit (DAPO's soft overlong punishment); `off`:"
            " neither."
        ),
    )
    buffer_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "With `soft`: the penalty grows from 0 at `max_tokens - buffer_tokens` completion"
            " tokens to `penalty_factor` at `max_tokens`."
        ),
    )
    penalty_factor: float = Field(
        1.0, ge=0.0, description="With `soft`: the penalty at the length limit."
    )

    @model_validator(mode="after")
    def _buffer_for_soft(self) -> OverlongSection:
        if self.mode == "soft" and self.buffer_tokens is None:
            raise ValueError("overlong mode 'soft' needs buffer_tokens")
        if self.mode != "soft" and self.buffer_tokens is not None:
            raise ValueError(
                f"buffer_tokens is only used by mode 'soft' (mode is {self.mode!r});"
                " remove it or set mode = 'soft'"
            )
        return self


class AlgorithmSection(_Section):
    loss: ComponentRef | None = Field(
        None, description="Policy loss: a name or a table with `name` and the loss's keys."
    )
    advantage: ComponentRef | None = Field(
        None, description="Advantage estimator: a name or a table with `name` and its keys."
    )
    aux_losses: list[ComponentRef] = Field(
        default_factory=list,
        description=(
            "Auxiliary losses stacked on the policy loss, each a table with `name`, `coef` and"
            " the loss's keys."
        ),
    )
    aggregation: AggregationMode = Field(
        "token-mean", description="How per-token losses reduce to a scalar."
    )
    norm_length: int | None = Field(
        None,
        ge=1,
        description="Constant length divisor for `seq-mean-token-sum-norm` (required by it).",
    )
    group_size: int = Field(8, ge=1, description="Rollouts per task (one advantage group).")
    batch_size: int = Field(8, ge=1, description="Tasks per training step.")
    drop_zero_variance_groups: bool = Field(
        False, description="Leave out groups whose rewards are all equal (they carry no signal)."
    )
    filter_groups: Literal["none", "zero-variance"] = Field(
        "none",
        description=(
            "Dynamic sampling: `zero-variance` leaves out groups whose rewards are all equal and"
            " rolls out more tasks until the step has `batch_size` groups whose rewards differ"
            " (or `max_sample_batches` rounds ran); counted in `groups/*` metrics."
        ),
    )
    max_sample_batches: int = Field(
        3,
        ge=1,
        description=(
            "With `filter_groups`: the most rollout rounds one step takes (its first batch"
            " included); a step that runs out trains on the informative groups it has."
        ),
    )
    max_policy_age: int = Field(
        0,
        ge=0,
        description=(
            'With `[run].pipeline = "async"`: train only on samples at most this many weight'
            " versions older than the trainer at the update (at least `mini_batches * epochs`,"
            " the versions one step publishes); older ones are dropped and counted. 0 with"
            " `sync`."
        ),
    )
    proximal: Literal["rollout", "recompute"] = Field(
        "rollout",
        description=(
            "Denominator of every loss's ratio: `rollout`, the sampler's logprobs; `recompute`,"
            " the trainer's logprobs computed once per batch before its first update."
        ),
    )
    epochs: int = Field(1, ge=1, description="Passes over each step's batch.")
    mini_batches: int = Field(
        1,
        ge=1,
        description=(
            "Optimizer steps per pass: the batch's datums are split into this many mini-batches,"
            " in order."
        ),
    )
    correction: CorrectionSection = Field(
        default_factory=CorrectionSection,
        description="Rollout corrections for the sampler/trainer mismatch, for any loss.",
    )
    kl: KLSection = Field(
        default_factory=KLSection,
        description=(
            "KL to the reference model (the trainer's starting weights), in the loss or in"
            " the reward; see `coef`, `estimator` and `in`."
        ),
    )
    entropy_coef: float = Field(
        0.0,
        ge=0.0,
        description=(
            "Entropy bonus: this times the policy's mean entropy over sampled tokens is"
            " subtracted from the objective (0: off)."
        ),
    )
    overlong: OverlongSection = Field(
        default_factory=OverlongSection,
        description="What happens to completions cut at the length limit.",
    )
    length_penalty: float = Field(
        0.0,
        ge=0.0,
        description=(
            "Reward shaping: each episode's reward is lowered by this times its sampled tokens"
            " divided by `[sampling].max_tokens` (0: off)."
        ),
    )

    @model_validator(mode="after")
    def _norm_length_needed(self) -> AlgorithmSection:
        if self.aggregation == "seq-mean-token-sum-norm" and self.norm_length is None:
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs norm_length")
        if self.filter_groups == "zero-variance" and self.group_size < 2:
            raise ValueError(
                "filter_groups 'zero-variance' needs group_size >= 2: a group of one has no"
                " variance, so every group would be filtered; raise group_size or set"
                " filter_groups = 'none'"
            )
        return self


class SamplingSection(_Section):
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for training.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int = Field(256, ge=1, description="Most new tokens per model call.")


class RolloutSection(_Section):
    max_concurrency: int = Field(8, ge=1, description="Rollouts in flight at once.")
    max_infra_retries: int = Field(
        2, ge=0, description="Retries of a rollout that failed for infrastructure reasons."
    )
    max_failed_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description=(
            "Stop the run (exit 1, the step untrained) when more than this fraction of a"
            " step's rollouts failed on infrastructure after their retries (1: never stop)."
        ),
    )
    mask: list[str] = Field(
        default_factory=lambda: [str(reason) for reason in Termination if reason.is_infrastructure],
        description=(
            "Infrastructure reasons whose rollouts are masked: retried, then left out of"
            " their group (never trained, outside the group baseline). A reason left out is"
            " scored as the policy's failure, reward 0; without `no_model_call` an agent that"
            " made no model call keeps its harness's ending and is graded. Known:"
            " sandbox_error, verifier_error, environment_start_timeout, agent_setup_timeout,"
            " verifier_timeout, grading_error, no_model_call (default: all of them)."
        ),
    )
    max_verifier_timeouts: int | None = Field(
        None,
        ge=0,
        description=(
            "Stop the run (exit 1) once more rollout attempts than this ended"
            " `verifier_timeout`, naming each task (unset: no limit)."
        ),
    )

    @field_validator("mask")
    @classmethod
    def _known_reasons(cls, mask: list[str]) -> list[str]:
        known = [str(reason) for reason in Termination if reason.is_infrastructure]
        for reason in mask:
            if reason not in known:
                policy = reason in {str(r) for r in Termination}
                why = "is the policy's own reason and always scored" if policy else "is unknown"
                raise ValueError(f"{reason!r} {why}; a mask names any of {', '.join(known)}")
        return list(dict.fromkeys(mask))


BUILTIN_LAUNCHERS = ("in-process", "local-process")
"""The values of ``[scheduler].launcher`` the core runs itself; any other names a trainer
launcher a plugin provides."""


def waiting_groups_bound(batch_size: int, max_policy_age: int, versions_per_step: int) -> int:
    """The most groups that can wait for a stopped trainer: the sampler starts batch ``r`` only
    once step ``r - 1 - lead`` is trained (``lead = max_policy_age // versions_per_step``), so
    at most ``lead + 1`` batches wait."""
    return batch_size * (max_policy_age // versions_per_step + 1)


NODE_PRECISIONS = ("bf16", "fp16", "fp32", "fp8", "int8", "int4")
"""The precisions a node class may declare; only ``bf16``, ``fp16`` and ``fp32`` train."""


class NodeClassSection(_Section):
    spot: bool = Field(
        False,
        description=(
            "Whether nodes of this class are spot (reclaimable) machines; spot nodes never"
            " become the trainer."
        ),
    )
    precision: Literal[NODE_PRECISIONS] = Field(  # type: ignore[valid-type]
        "bf16",
        description=(
            "The precision the node runs the policy in; `fp8`, `int8` and `int4` sample but"
            " never train."
        ),
    )
    capacity: float = Field(
        1.0,
        gt=0,
        description=(
            "How much the node can hold, in any unit the pool shares (accelerator GiB, GPU"
            " count): of the nodes that may become the trainer, the largest converts first."
        ),
    )


class NodeSection(_Section):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, description="The node's name in the journal and in errors.")
    url: str = Field(
        min_length=1,
        description="The node's model server: one of the `[sampler]`'s server urls.",
    )
    node_class: str = Field(
        alias="class",
        min_length=1,
        description="The node's class: a table of `[scheduler.node_classes]`.",
    )


class SchedulerSection(_Section):
    q_on_groups: int | None = Field(
        None,
        ge=1,
        description=(
            "Start the trainer once this many groups wait in the buffer (default: all the age"
            " bound lets wait, `batch_size * (max_policy_age // (mini_batches * epochs) + 1)`,"
            " times `alpha`); between one batch and that bound."
        ),
    )
    alpha: float | None = Field(
        None,
        gt=0,
        le=1,
        description=(
            "Start the trainer once this fraction of what the age bound lets wait is in the"
            " buffer (rounded up, at least one batch; unset: 1, the whole bound); instead of"
            " `q_on_groups`."
        ),
    )
    idle_stop_s: float | None = Field(
        None,
        gt=0,
        description=(
            "Stop the trainer after the buffer has been empty this long (default: the last"
            " measured trainer start-up time, or `idle_fallback_s` before one was measured)."
        ),
    )
    idle_fallback_s: float = Field(
        60.0, gt=0, description="Idle time before a stop while no start-up time is measured."
    )
    max_failures: int = Field(
        3,
        ge=1,
        description=(
            "Give up (exit 3) after this many trainer incarnations in a row fail without"
            " training a step."
        ),
    )
    poll_s: float = Field(
        1.0, gt=0, description="How often the trainer looks at the shared state for new batches."
    )
    min_round_s: float = Field(
        0.0,
        ge=0,
        description=(
            "The sampler waits so that its rounds (one batch each) start at least this many"
            " seconds apart (0: no wait). In a short run whose sampler outpaces the trainer,"
            " the trainer then idles between batches, and S1 stops it once it idles"
            " `idle_stop_s`; negative values are refused."
        ),
    )
    launcher: Literal[BUILTIN_LAUNCHERS] | ComponentRef = Field(  # type: ignore[valid-type]
        "in-process",
        description=(
            "`in-process`: each trainer incarnation runs in the `--role trainer` process;"
            " `local-process`: that process only schedules, and starts each incarnation as a"
            " process of its own (`rllm-core run --role trainer --incarnation N`); any other"
            " name, or a table with `name` and the launcher's keys"
            ' (`{ name = "modal", image = "...", gpu = "A100" }`), selects a trainer launcher'
            " a plugin provides (`rllm-core plugins` lists them), which starts each"
            " incarnation where it runs jobs. Every launcher needs an `[object_store]`."
        ),
    )
    ready_timeout_s: float | None = Field(
        None,
        gt=0,
        description=(
            "How long a launched trainer incarnation may take from its launch to its ready"
            " marker before it is released and counted as failed (default 600; only with a"
            " `launcher` other than `in-process`)."
        ),
    )

    node_classes: dict[str, NodeClassSection] = Field(
        default_factory=dict,
        description=(
            "The kinds of machine in the node pool, by name: whether they are spot machines,"
            " their precision and capacity (see `nodes`)."
        ),
    )
    nodes: list[NodeSection] = Field(
        default_factory=list,
        description=(
            "Convertible nodes: the machines of the `[sampler]`'s servers, each `{ name, url,"
            " class }`. When S1 starts the trainer, the best node that may train stops"
            " sampling and runs the incarnation (through `launcher`); when S1 stops it, the"
            " node samples again. Empty: the trainer has machines of its own."
        ),
    )
    node_grace_s: float = Field(
        30.0,
        ge=0,
        description=(
            "How long a converting node's requests in flight may take to finish before they"
            " are cut and sent to another node (only with `nodes`)."
        ),
    )

    @field_validator("launcher")
    @classmethod
    def _builtin_by_name(cls, value: Any) -> Any:
        if isinstance(value, ComponentRef) and canonical_name(value.name) in BUILTIN_LAUNCHERS:
            name = canonical_name(value.name)
            if value.options:
                raise ValueError(
                    f"launcher {name!r} is built in and takes no keys (got"
                    f' {", ".join(sorted(value.options))}): write launcher = "{name}"'
                )
            return name
        return value

    @property
    def launches(self) -> bool:
        """Whether the trainer runs as launched jobs (any launcher but ``in-process``)."""
        return self.launcher != "in-process"

    @model_validator(mode="after")
    def _nodes_consistent(self) -> SchedulerSection:
        if not self.nodes:
            if self.node_classes:
                raise ValueError(
                    "node_classes describe the machines of a node pool, and nodes is empty:"
                    " add [[scheduler.nodes]] or remove node_classes"
                )
            if "node_grace_s" in self.model_fields_set:
                raise ValueError(
                    f"node_grace_s = {self.node_grace_s} bounds a convertible node's"
                    " conversion, and nodes is empty: add [[scheduler.nodes]] or remove"
                    " node_grace_s"
                )
            return self
        for what in ("name", "url"):
            values = [getattr(node, what).rstrip("/") for node in self.nodes]
            repeated = sorted({value for value in values if values.count(value) > 1})
            if repeated:
                raise ValueError(
                    f"nodes: {what} {', '.join(map(repr, repeated))} appears more than once;"
                    f" each node has a {what} of its own"
                )
        for node in self.nodes:
            if node.node_class not in self.node_classes:
                known = ", ".join(sorted(self.node_classes)) or "none"
                raise ValueError(
                    f"node {node.name!r} has class {node.node_class!r}, which"
                    f" [scheduler.node_classes] does not define (it defines {known}): add"
                    f" [scheduler.node_classes.{node.node_class}] or fix the class"
                )
        if len(self.nodes) < 2:
            raise ValueError(
                f"nodes lists one node ({self.nodes[0].name!r}); it would be the pool's last"
                " sampler, which never converts: list two nodes or more, or remove nodes"
            )
        if not self.launches:
            raise ValueError(
                "nodes: a node runs the trainer incarnation as a job, and"
                ' launcher = "in-process" runs it in the scheduler\'s process: set launcher ='
                ' "local-process" or a plugin\'s launcher'
            )
        return self

    @model_validator(mode="after")
    def _ready_timeout_needs_a_launcher(self) -> SchedulerSection:
        if self.ready_timeout_s is not None and not self.launches:
            raise ValueError(
                f"ready_timeout_s = {self.ready_timeout_s} bounds the start of a launched"
                ' trainer, and launcher = "in-process" launches none: set launcher ='
                ' "local-process" or a plugin\'s launcher, or remove ready_timeout_s'
            )
        return self


class GatewaySection(_Section):
    host: str = Field(
        "127.0.0.1", description="Address the run's gateway binds (loopback unless changed)."
    )
    port: int = Field(
        0, ge=0, le=65535, description="Port the run's gateway binds (0: a free port)."
    )
    token_mode: Literal["cumulative", "plain"] = Field(
        "cumulative",
        description=(
            "`cumulative`: each turn's prompt extends the tokens sampled before it (one datum"
            " per episode when the chain holds); `plain`: every turn renders the whole"
            " conversation again."
        ),
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "Refuse a model call whose prompt has more tokens than this with a 400"
            " (`prompt_too_long`) before sampling, as `gateway serve --max-prompt-tokens`"
            " does; the agent sees an OpenAI `BadRequestError` (unset: no limit)."
        ),
    )
    workers: int = Field(
        1,
        ge=1,
        description=(
            "Gateway processes for the run's rollouts, behind a front on `host` and `port`"
            " that shards sessions by id (as `gateway serve --workers N`): each session's"
            " model calls, token accumulator and traces stay in one worker, its traces come"
            " home to the run's `[trace_store]` when it ends, and every worker follows the"
            " policy the `[sampler]` serves. Above 1 needs a `[sampler]` other processes can"
            " reach (`vllm`) and no convertible `[scheduler]` nodes; `plan check` says why"
            " otherwise."
        ),
    )


class SftSection(_Section):
    """Supervised fine-tuning (``rllm-core sft``); see docs/sft.md."""

    data: Annotated[str | None, PlanPath()] = Field(
        None,
        description=(
            "Training examples: a chat JSONL file (one `{messages, tools}` object a line), a"
            " parquet, arrow or jsonl file read with `datasets`, or a folder of such files."
            " Relative to the plan's folder."
        ),
    )
    format: Literal["auto", "chat-jsonl", "datasets"] = Field(
        "auto",
        description=(
            "How `data` is read: `chat-jsonl` (plain JSON lines), `datasets`"
            " (`datasets.load_dataset`, needs the `datasets` package), or `auto`: `.jsonl`"
            " files as chat JSONL, anything else through `datasets`."
        ),
    )
    messages_field: str = Field(
        "messages", min_length=1, description="Column (or JSON key) holding the chat messages."
    )
    tools_field: str = Field(
        "tools", min_length=1, description="Column (or JSON key) holding the tools, if any."
    )
    from_run: Annotated[str | None, PlanPath()] = Field(
        None,
        description=(
            "Train on the episodes of a run folder instead of `data` (rejection sampling): the"
            " tokens the policy sampled, exactly as the run trained on them."
        ),
    )
    min_reward: float | None = Field(
        None,
        description="With `from_run`: keep only episodes whose reward is at least this.",
    )
    eval_data: Annotated[str | None, PlanPath()] = Field(
        None,
        description="Held-out examples in the same format as `data`, scored by mean NLL.",
    )
    eval_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description=(
            "Share of the training examples held out for evaluation instead (chosen with"
            " `[run].seed`; 0: none)."
        ),
    )
    eval_every: int = Field(
        0,
        ge=0,
        description="Score the eval split every N optimizer steps (0: only at the end).",
    )
    epochs: int = Field(1, ge=1, description="Passes over the training examples.")
    batch_size: int = Field(
        8,
        ge=1,
        description="Examples per optimizer step (the last step of an epoch may hold fewer).",
    )
    max_length: int | None = Field(
        None,
        ge=2,
        description=(
            "Longest example in tokens; a longer one is truncated or dropped (`overlong`),"
            " and the run warns with the count. Unset: no limit."
        ),
    )
    overlong: Literal["truncate", "drop"] = Field(
        "truncate",
        description=(
            "An example longer than `max_length`: `truncate` trains on its first `max_length`"
            " tokens (dropped if they hold no assistant token), `drop` leaves it out (a cut"
            " conversation teaches an unfinished turn)."
        ),
    )
    packing: bool = Field(
        False,
        description=(
            "Pack several examples into one row of at most `max_length` tokens (which it then"
            " requires) instead of padding each; needs a trainer backend that packs sequences."
        ),
    )
    export: Annotated[str | None, PlanPath()] = Field(
        None,
        description=(
            "At the end, write the trained model as a standalone model folder here (LoRA merged"
            " into the base weights), for an RL plan's `[trainer].model` to name."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> SftSection:
        if self.data is not None and self.from_run is not None:
            raise ValueError("set data or from_run, not both")
        if self.min_reward is not None and self.from_run is None:
            raise ValueError("min_reward filters the episodes of from_run; set from_run")
        if self.eval_data is not None and self.eval_fraction > 0:
            raise ValueError("set eval_data or eval_fraction, not both")
        if self.packing and self.max_length is None:
            raise ValueError("packing fills rows of max_length tokens; set max_length")
        if "overlong" in self.model_fields_set and self.max_length is None:
            raise ValueError(
                "overlong says what becomes of examples longer than max_length; set max_length"
            )
        return self


def component_section(kind: str, description: str) -> Any:
    """A plan section that selects one component of ``kind`` (``[trainer] name = "torch"``):
    declare it as a field of :class:`Plan` with this default, and the plan loader, resolver
    and reference page find it."""
    return Field(None, description=description, json_schema_extra={"kind": kind})


def component_sections(plan: type[BaseModel]) -> dict[str, Kind]:
    """The sections of ``plan`` declared with :func:`component_section`, with their kinds."""
    found = {}
    for name, info in plan.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and "kind" in extra:
            found[name] = Kind(str(extra["kind"]))
    return found


class Plan(_Section):
    """A whole plan. Every section is optional for validation; ``rllm-core run`` says which
    ones a run needs."""

    run: RunSection = Field(default_factory=RunSection, description="Run identity and length.")
    algorithm: AlgorithmSection = Field(
        default_factory=AlgorithmSection, description="Losses, advantages and batch shape."
    )
    sampling: SamplingSection = Field(
        default_factory=SamplingSection, description="Decoding settings enforced at the gateway."
    )
    rollout: RolloutSection = Field(
        default_factory=RolloutSection, description="Concurrency and retries of rollouts."
    )
    gateway: GatewaySection = Field(
        default_factory=GatewaySection, description="The gateway a run serves its model through."
    )
    trainer: ComponentRef | None = component_section("trainer_backend", "Trainer backend.")
    sampler: ComponentRef | None = component_section(
        "sampler",
        "Model servers the rollouts sample from, kept on the trainer's policy after every"
        " optimizer step (unset: the trainer backend's own sampler).",
    )
    renderer: ComponentRef | None = component_section("renderer", "Chat renderer.")
    sandbox: ComponentRef | None = component_section("sandbox_backend", "Sandbox backend.")
    harness: ComponentRef | None = component_section("harness", "Harness (agent loop).")
    tasks: ComponentRef | None = component_section("task_source", "Task source.")
    trace_store: ComponentRef | None = component_section("trace_store", "Trace store.")
    sample_buffer: ComponentRef | None = component_section("sample_buffer", "Sample buffer.")
    object_store: ComponentRef | None = component_section("object_store", "Object store.")
    scheduler: SchedulerSection = Field(
        default_factory=SchedulerSection,
        description=(
            "When a trainer started with `--role trainer` runs (rule S1); see"
            f" {docs_page('scheduler')}."
        ),
    )
    loggers: list[ComponentRef] = Field(default_factory=list, description="Metrics loggers.")
    sft: SftSection = Field(
        default_factory=SftSection,
        description=(
            "Supervised fine-tuning, for `rllm-core sft` (a plan with this section is an SFT"
            f" plan; `rllm-core run` refuses it). See {docs_page('sft')}."
        ),
    )

    @property
    def is_sft(self) -> bool:
        """Whether the plan has an ``[sft]`` section."""
        return "sft" in self.model_fields_set

    @model_serializer(mode="wrap")
    def _without_unset_sft(self, handler: Any) -> Any:
        # An RL plan's dump (plan.resolved.json) holds no [sft] table it never had.
        data = handler(self)
        if isinstance(data, dict) and not self.is_sft:
            data.pop("sft", None)
        return data


COMPONENT_SECTIONS: dict[str, Kind] = component_sections(Plan)
"""Top-level sections that each select one component of a kind."""
