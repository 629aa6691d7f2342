"""Shared records that cross component boundaries.

Every record is a ``msgspec.Struct``: cheap to build on hot paths, and encodable to JSON or
msgpack without adapters. Token sequences are plain ``list[int]`` and per-token values
``list[float]``; storage plugins choose their own packed encodings.

The records follow the life of one rollout:

``Task`` -> the harness talks to the gateway -> one ``TraceRecord`` per model call (delta-chain:
a root stores its full prompt, a child stores only the tokens its prompt adds to
``parent.prompt + parent.completion``) -> ``Step`` / ``Trajectory`` / ``Episode`` rebuilt from
traces -> ``Datum`` (prefix-merged token sequence with masks) -> ``Sample`` (a datum with its
advantage and provenance, as the sample buffer stores it) -> ``Cut`` (a consistent checkpoint).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

__all__ = [
    "DEFAULT_MASK",
    "HISTORY_EDITED",
    "HISTORY_REASONS",
    "HISTORY_SUMMARIZED",
    "HISTORY_TRUNCATED",
    "BacklogStats",
    "Cut",
    "CutTrigger",
    "ExportedWeights",
    "Datum",
    "Episode",
    "ExecResult",
    "FileInfo",
    "Grade",
    "HarnessOutcome",
    "LLMEndpoint",
    "Message",
    "NetworkPolicy",
    "ParsedResponse",
    "ParsedToolCall",
    "RenderedTokens",
    "RunInfo",
    "RunStatus",
    "Sample",
    "SampleBatch",
    "SampleRequest",
    "SampleResult",
    "SamplingParams",
    "SandboxSpec",
    "Step",
    "StoredFile",
    "Task",
    "Termination",
    "TraceCounts",
    "ToolCall",
    "ToolSpec",
    "Trace",
    "TraceRecord",
    "Trajectory",
    "WorkerStatus",
]


# --------------------------------------------------------------------------------------------
# Conversation
# --------------------------------------------------------------------------------------------


class ToolCall(msgspec.Struct, kw_only=True, frozen=True):
    """A function call requested by the model; ``arguments`` is the raw JSON text it wrote."""

    id: str
    name: str
    arguments: str


class ToolSpec(msgspec.Struct, kw_only=True, frozen=True):
    """A tool offered to the model, in the OpenAI function-tool shape."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class Message(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One chat message.

    ``role`` is ``system``, ``user``, ``assistant`` or ``tool``. ``reasoning`` holds an
    assistant's thinking text when the renderer separates it; ``tool_call_id`` links a tool
    result to the call it answers.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


class RenderedTokens(msgspec.Struct, kw_only=True, frozen=True):
    """Token ids of a rendered conversation with per-token attribution.

    ``message_indices[i]`` is the index of the message token ``i`` belongs to, or ``-1`` for
    scaffold outside any message (a generation prompt). ``sampled_mask[i]`` is true where the
    model produced the token (assistant content and its closing token).
    """

    token_ids: list[int]
    message_indices: list[int]
    sampled_mask: list[bool]


class ParsedToolCall(msgspec.Struct, kw_only=True, frozen=True):
    """One attempted tool call. ``status`` keeps malformed attempts visible instead of dropping
    them: ``ok``, ``invalid_json``, ``missing_name`` or ``unterminated``."""

    status: Literal["ok", "invalid_json", "missing_name", "unterminated"]
    raw: str
    call: ToolCall | None = None
    error: str | None = None


class ParsedResponse(msgspec.Struct, kw_only=True, frozen=True):
    """What a renderer reads back from sampled completion tokens.

    ``stopped`` is true when the tokens closed the turn with a stop token, false for a
    completion cut off before its close (``finish_reason="length"``).
    """

    content: str
    reasoning: str | None = None
    tool_calls: tuple[ParsedToolCall, ...] = ()
    stopped: bool = True


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


class SamplingParams(msgspec.Struct, kw_only=True, frozen=True):
    """Decoding settings. ``seed`` makes one request reproducible on backends that support it."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


class SampleRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Token ids in: the prompt exactly as the model must see it.

    ``session_id`` is the gateway session the request belongs to ("" outside one): a sampler
    on a service that keeps a session's calls on one replica (so a multi-turn agent's growing
    prompt hits that replica's prefix cache) sends it in the field the service reads."""

    prompt_token_ids: list[int]
    params: SamplingParams = SamplingParams()
    request_id: str = ""
    session_id: str = ""


class SampleResult(msgspec.Struct, kw_only=True, frozen=True):
    """Token ids out, with the sampler's logprob of each sampled token.

    ``finish_reason`` is ``stop`` (a stop token was produced; it is included in
    ``completion_token_ids``) or ``length``. ``weight_version`` names the weights that produced
    the tokens.
    """

    completion_token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    weight_version: int


class ExportedWeights(msgspec.Struct, kw_only=True, frozen=True):
    """A policy written in the layout model servers load
    (:meth:`~rllm_core.ports.WeightExporter.export_weights`).

    ``path`` is the folder; ``version`` the weight version it holds; ``kind`` is ``"lora"``
    (a PEFT adapter folder over ``base_model``) or ``"full"`` (a model folder that loads on
    its own); ``base_model`` is the model folder or name the backend loaded, ``lora_rank`` the
    adapter's rank (0 for ``"full"``), which a server must be started to accept.
    """

    path: str
    version: int
    kind: Literal["lora", "full"]
    base_model: str
    lora_rank: int = 0


class WorkerStatus(msgspec.Struct, kw_only=True, frozen=True):
    """One server of a :class:`~rllm_core.ports.WorkerPool` as the pool sees it.

    ``in_flight`` counts requests now being served, ``sessions`` the routing keys that stick to
    it, ``served`` its successful answers, ``failures`` its failed ones (connection errors and
    error statuses); ``last_error`` is the latest of those, or ``None``.
    """

    url: str
    healthy: bool
    in_flight: int
    sessions: int
    served: int
    failures: int
    last_error: str | None


# --------------------------------------------------------------------------------------------
# Traces: one record per model call, stored as a delta chain
# --------------------------------------------------------------------------------------------


class TraceRecord(msgspec.Struct, kw_only=True, frozen=True):
    """One model call as captured by the gateway.

    Delta-chain contract: when ``parent_trace_id`` is ``None`` the record is a root and
    ``prompt_delta_token_ids`` is its full prompt. Otherwise the full prompt is
    ``full_prompt(parent) + parent.completion_token_ids + prompt_delta_token_ids``. Storage
    therefore grows linearly with the number of turns.

    ``lineage_id`` separates independent chains inside one session (a sub-agent with its own
    system prompt). ``turn`` counts calls within the lineage from 0. ``messages_delta`` holds the
    messages this call added, for display; training never re-tokenizes them. ``flags`` marks
    what the gateway noticed about the call: ``tool_choice_unmet`` when the request required a
    tool call (``tool_choice`` ``required`` or a named function) that the reply does not hold;
    on a call whose messages break the lineage's history (``reset_reason`` ``history_truncated``,
    ``history_summarized`` or ``history_edited``) it also holds where: ``history_at=<index>``,
    ``history_kept=<n>``, ``history_dropped=<n>``, ``history_inserted=<n>`` and, for a new
    lineage that continues another, ``history_from=<lineage>``.
    """

    trace_id: str
    session_id: str
    lineage_id: str = "main"
    turn: int = 0
    parent_trace_id: str | None = None
    prompt_delta_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"
    weight_version: int = 0
    model: str = ""
    messages_delta: tuple[Message, ...] = ()
    reset_reason: str | None = None
    created_at: float = 0.0
    latency_s: float = 0.0
    flags: tuple[str, ...] = ()


class Trace(msgspec.Struct, kw_only=True, frozen=True):
    """A trace with its full prompt rebuilt from the chain.

    ``chain_complete`` is false when an ancestor is missing; ``prompt_token_ids`` then holds only
    what could be proven and must not be trained on.
    """

    record: TraceRecord
    prompt_token_ids: list[int]
    chain_complete: bool = True


# --------------------------------------------------------------------------------------------
# Rollouts
# --------------------------------------------------------------------------------------------


HISTORY_TRUNCATED = "history_truncated"
HISTORY_SUMMARIZED = "history_summarized"
HISTORY_EDITED = "history_edited"
HISTORY_REASONS = (HISTORY_TRUNCATED, HISTORY_SUMMARIZED, HISTORY_EDITED)
"""How a request may rewrite the recorded conversation of a lineage (the gateway records which,
:mod:`rllm_core.gateway.history`; training starts a new datum there)."""


class Termination(enum.StrEnum):
    """Why an episode ended.

    The policy's reasons (``done``, ``max_turns``, ``timeout``, ``context_length``,
    ``format_error``, ``model_error``) are always scored. The infrastructure reasons are where
    the rollout itself failed: ``sandbox_error``, ``environment_start_timeout`` (the sandbox or
    the task's environment build did not come up in time), ``agent_setup_timeout`` (installing
    or starting the agent ran past its limit), ``verifier_error`` (the verifier crashed),
    ``verifier_timeout``, ``grading_error`` (the verifier ran but its reward could not be
    read) and ``no_model_call`` (the agent made no model call, or every completion it got was
    empty: zero tokens). Each of them is masked, that is retried and then left out of
    training, unless ``[rollout].mask`` leaves it out (see :data:`DEFAULT_MASK`)."""

    DONE = "done"
    MAX_TURNS = "max_turns"
    TIMEOUT = "timeout"
    CONTEXT_LENGTH = "context_length"
    FORMAT_ERROR = "format_error"
    MODEL_ERROR = "model_error"
    SANDBOX_ERROR = "sandbox_error"
    VERIFIER_ERROR = "verifier_error"
    ENVIRONMENT_START_TIMEOUT = "environment_start_timeout"
    AGENT_SETUP_TIMEOUT = "agent_setup_timeout"
    VERIFIER_TIMEOUT = "verifier_timeout"
    GRADING_ERROR = "grading_error"
    NO_MODEL_CALL = "no_model_call"

    @property
    def is_infrastructure(self) -> bool:
        """Whether the rollout failed rather than the policy (a reason ``[rollout].mask`` may
        name)."""
        return self in DEFAULT_MASK


DEFAULT_MASK: frozenset[Termination] = frozenset(
    {
        Termination.SANDBOX_ERROR,
        Termination.VERIFIER_ERROR,
        Termination.ENVIRONMENT_START_TIMEOUT,
        Termination.AGENT_SETUP_TIMEOUT,
        Termination.VERIFIER_TIMEOUT,
        Termination.GRADING_ERROR,
        Termination.NO_MODEL_CALL,
    }
)
"""The infrastructure reasons, every one masked by default (``[rollout].mask``'s default)."""


class Step(msgspec.Struct, kw_only=True, frozen=True):
    """One model call of a trajectory, with full token sequences."""

    trace_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"
    weight_version: int = 0
    reward: float | None = None


class Trajectory(msgspec.Struct, kw_only=True, frozen=True):
    """The steps of one lineage, in order."""

    lineage_id: str
    steps: tuple[Step, ...]
    reward: float = 0.0


class TraceCounts(msgspec.Struct, kw_only=True, frozen=True):
    """What an episode's traces showed, counted once when the episode is built:
    ``incomplete_chains``, traces whose delta chain misses an ancestor (the datum builder's
    report counts them), ``history_breaks``, model calls that rewrote their lineage's
    history, by reason (the step's ``resets/<reason>`` metrics), ``tool_calls``, the ``ok``
    tool calls of its replies, and ``tool_calls_invalid``, model calls whose reply held a
    tool-call attempt that is not ``ok`` (flagged ``tool_call_invalid``; the step's
    ``tools/calls`` and ``tools/invalid``)."""

    incomplete_chains: int = 0
    history_breaks: dict[str, int] = msgspec.field(default_factory=dict)
    tool_calls: int = 0
    tool_calls_invalid: int = 0


class Episode(msgspec.Struct, kw_only=True, frozen=True):
    """One rollout of one task: its trajectories, reward and how it ended. ``trace_counts``
    are what its traces showed; ``denied`` counts the requests the gateway refused to its
    session token (another session's routes, an admin route); ``metadata`` is free-form (the
    harness's own, timings)."""

    episode_id: str
    task_id: str
    group_id: str
    session_id: str
    trajectories: tuple[Trajectory, ...]
    reward: float
    termination: Termination = Termination.DONE
    signals: dict[str, float] = msgspec.field(default_factory=dict)
    trace_counts: TraceCounts = msgspec.field(default_factory=TraceCounts)
    denied: int = 0
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class Datum(msgspec.Struct, kw_only=True, frozen=True):
    """One training sequence.

    ``token_ids`` is the prefix-merged sequence ``[prompt0, completion0, delta1, completion1,
    ...]``. Every per-token list has the same length as ``token_ids``. ``action_mask`` is true
    on tokens the policy sampled (the ones a policy loss trains); ``observation_mask`` is true
    on environment tokens after the first prompt (tool and terminal output). ``logprobs`` are
    the sampler's logprobs on action tokens and 0.0 elsewhere. ``advantages`` are per token.
    ``proximal_logprobs``, when set, are the trainer's logprobs of the same tokens computed
    before the batch's first update (``[algorithm].proximal = "recompute"``), 0.0 where no
    logprob exists. ``ref_logprobs``, when set, are the reference model's logprobs of the same
    tokens (``[algorithm.kl]`` in the loss), 0.0 where no logprob exists.
    """

    token_ids: list[int]
    logprobs: list[float]
    advantages: list[float]
    action_mask: list[bool]
    observation_mask: list[bool]
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    proximal_logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        for field in ("logprobs", "advantages", "action_mask", "observation_mask"):
            if len(getattr(self, field)) != n:
                raise ValueError(
                    f"Datum.{field} has {len(getattr(self, field))} entries but token_ids has {n}"
                )
        for field in ("proximal_logprobs", "ref_logprobs"):
            values = getattr(self, field)
            if values is not None and len(values) != n:
                raise ValueError(f"Datum.{field} has {len(values)} entries but token_ids has {n}")


class Sample(msgspec.Struct, kw_only=True, frozen=True):
    """A datum as the sample buffer stores it, with provenance.

    ``sequence`` is assigned by the buffer on append (monotonic, gap-free per buffer);
    ``weight_version`` is the policy version that sampled it, so a trainer can bound policy age.
    """

    datum: Datum
    group_id: str
    episode_id: str
    weight_version: int
    reward: float
    sequence: int = -1


class SampleBatch(msgspec.Struct, kw_only=True, frozen=True):
    """Samples selected for one optimizer step; ``watermark`` is what to commit once trained."""

    samples: tuple[Sample, ...]
    watermark: int


class BacklogStats(msgspec.Struct, kw_only=True, frozen=True):
    """What a sample buffer holds after its committed watermark, stale samples included.

    ``samples`` equals the buffer's ``pending()``; ``groups`` counts their distinct
    ``group_id``; ``oldest_weight_version`` is the smallest ``weight_version`` among them
    (``None`` when there are none) and ``per_version`` the number of samples per weight version.
    """

    samples: int
    groups: int
    oldest_weight_version: int | None
    per_version: dict[int, int]

    @classmethod
    def of(cls, samples: Iterable[tuple[str, int]]) -> BacklogStats:
        """The statistics of ``(group_id, weight_version)`` pairs, one per pending sample."""
        groups: set[str] = set()
        per_version: dict[int, int] = {}
        for group_id, version in samples:
            groups.add(group_id)
            per_version[version] = per_version.get(version, 0) + 1
        return cls(
            samples=sum(per_version.values()),
            groups=len(groups),
            oldest_weight_version=min(per_version, default=None),
            per_version=dict(sorted(per_version.items())),
        )


CutTrigger = Literal["scheduled", "preempt", "manual", "final"]
"""Why a cut was written: every ``save_every`` steps, on a stop signal, on request, at the end."""


class StoredFile(msgspec.Struct, kw_only=True, frozen=True):
    """A file kept in the object store as one object: its bytes' sha256 (hex) and size."""

    sha256: str
    size: int


class Cut(msgspec.Struct, kw_only=True, frozen=True):
    """A consistent checkpoint, as the manifest of its objects in the object store.

    ``files`` maps each file's path inside the cut (``trainer/...`` as the backend's
    ``save_state`` wrote it, and ``loop.json``) to its digest. ``step`` is the training steps
    completed, ``weight_version`` the policy version the trainer state holds and
    ``buffer_watermark`` the sample buffer's committed watermark, so restoring a cut and
    resuming neither retrains a consumed sample nor skips one. ``incarnation`` numbers the
    trainer process that wrote it (see :mod:`rllm_core.run.cuts`).
    """

    step: int
    incarnation: int
    trigger: CutTrigger
    weight_version: int
    buffer_watermark: int
    created_at: float
    files: dict[str, StoredFile]


# --------------------------------------------------------------------------------------------
# Tasks, sandboxes and harnesses
# --------------------------------------------------------------------------------------------


class NetworkPolicy(enum.StrEnum):
    """What a sandbox's processes may reach over the network, narrowest first.

    ``NONE``: nothing (loopback inside the sandbox only). ``GATEWAY``: the host and port of
    the spec's ``gateway_url`` and nothing else; the sandbox's ``gateway_url`` is where its
    processes reach it. ``FULL``: whatever the backend's own network reaches, which for a
    sandbox on this machine includes every service listening on it.
    """

    NONE = "none"
    GATEWAY = "gateway"
    FULL = "full"

    @property
    def rank(self) -> int:
        """Order by reach: ``NONE`` < ``GATEWAY`` < ``FULL``."""
        return _NETWORK_RANK[self]


_NETWORK_RANK = {NetworkPolicy.NONE: 0, NetworkPolicy.GATEWAY: 1, NetworkPolicy.FULL: 2}


class SandboxSpec(msgspec.Struct, kw_only=True, frozen=True):
    """What a sandbox must look like. Resources: ``cpu`` in cores, ``memory_mb`` and ``disk_mb``
    in MiB; ``lifetime_s`` bounds how long the backend keeps it before reclaiming it.
    ``context_dir`` is the build context of ``dockerfile``: the folder its ``COPY`` and ``ADD``
    sources are read from (a backend that builds the image sends it; unset, the build has an
    empty context). ``gateway_url`` is, with ``network = "gateway"``, the URL of the gateway
    the sandbox may reach (the rollout sets it to the episode's session URL; only its scheme,
    host and port choose what is reachable); unset, such a sandbox reaches nothing.
    ``replays_dockerfile`` says that ``image`` is only ``dockerfile``'s base image (its
    ``FROM``) and that the task source replays the rest of it when it prepares the sandbox; a
    backend that builds Dockerfiles gets the spec with ``image`` unset and this flag off
    instead, and builds ``dockerfile`` (see :func:`~rllm_core.ports.sandboxes.task_for_backend`)."""

    image: str | None = None
    dockerfile: str | None = None
    replays_dockerfile: bool = False
    context_dir: str | None = None
    workdir: str = "/workspace"
    cpu: float = 1.0
    memory_mb: int = 2048
    disk_mb: int = 10240
    lifetime_s: float = 3600.0
    env: dict[str, str] = msgspec.field(default_factory=dict)
    user: str | None = None
    network: NetworkPolicy = NetworkPolicy.NONE
    gateway_url: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class Task(msgspec.Struct, kw_only=True, frozen=True):
    """A unit of work for a harness. ``data`` carries source-specific fields (an expected answer,
    a Harbor task directory); ``environment`` is set when the task needs a sandbox."""

    task_id: str
    instruction: str
    source: str = ""
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    environment: SandboxSpec | None = None
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class ExecResult(msgspec.Struct, kw_only=True, frozen=True):
    """Outcome of one command. A process killed by signal ``n`` reports ``128 + n``. When the
    backend merges streams, everything is in ``stdout`` and ``stderr`` is empty."""

    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False
    duration_s: float = 0.0


class FileInfo(msgspec.Struct, kw_only=True, frozen=True):
    path: str
    size: int
    is_dir: bool


class LLMEndpoint(msgspec.Struct, kw_only=True, frozen=True):
    """Where a harness sends OpenAI-compatible requests for one session."""

    base_url: str
    api_key: str
    model: str


class HarnessOutcome(msgspec.Struct, kw_only=True, frozen=True):
    """How an episode ended, as the harness saw it. ``answer`` is the final text, for task
    sources that grade it directly."""

    termination: Termination
    answer: str | None = None
    turns: int = 0
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class Grade(msgspec.Struct, kw_only=True, frozen=True):
    """A verifier's verdict: the reward and any extra named numeric signals."""

    reward: float
    signals: dict[str, float] = msgspec.field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


class RunStatus(enum.StrEnum):
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class RunInfo(msgspec.Struct, kw_only=True, frozen=True):
    """What lifecycle hooks learn about a run."""

    run_id: str
    name: str
    output_dir: str
    plan: dict[str, Any] = msgspec.field(default_factory=dict)
    started_at: float = 0.0
