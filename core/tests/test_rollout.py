"""The rollout runner over the real gateway: groups, rewards, token ids, retries, exclusion,
the concurrency bound, deadlines, cancellation and events."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reference.rollout_stack import gateway_runner
from reference.toy_renderer import IM_END, ToyChatRenderer
from rllm_core.errors import (
    RewardFileInvalid,
    RewardFileMissing,
    SandboxAuthError,
    SandboxCreateError,
    SandboxGone,
    SandboxStartTimeout,
    TaskSetupError,
    TaskSetupTimeout,
    VerifierCrashed,
    VerifierTimeout,
)
from rllm_core.gateway.engine import is_session_id
from rllm_core.gateway.server import Gateway
from rllm_core.plugins import PluginManager
from rllm_core.rollout import (
    InfraFailure,
    RolloutBatch,
    RolloutEvent,
    RolloutSettings,
    SessionGateway,
    SessionKey,
    TooManyVerifierTimeouts,
    infra_outcome,
    rollout_session_id,
)
from rllm_core.rollout.seeding import SeededGateway, session_seed
from rllm_core.testing.samplers import ScriptedSampler, scripted_logprob
from rllm_core.types import (
    DEFAULT_MASK,
    ExecResult,
    Grade,
    HarnessOutcome,
    LLMEndpoint,
    NetworkPolicy,
    SamplingParams,
    SandboxSpec,
    Task,
    Termination,
)

PLUGINS = PluginManager()
TOY = ToyChatRenderer()


SCRIPTED_MASK = DEFAULT_MASK - {Termination.NO_MODEL_CALL}
"""The mask of these tests: their scripted harnesses make no model call (no_model_call's own
tests pass the default)."""


def settings(**overrides: Any) -> RolloutSettings:
    values: dict[str, Any] = {
        "group_size": 2,
        "max_concurrency": 4,
        "max_infra_retries": 1,
        "mask": SCRIPTED_MASK,
    }
    values.update(overrides)
    return RolloutSettings(**values)


def memory_store() -> Any:
    return PLUGINS.get("trace_store", "memory").build({})


async def run_batch(
    tasks: list[Task],
    *,
    sampler: ScriptedSampler | None = None,
    harness: Any,
    source: Any,
    backend: Any = None,
    rollout: RolloutSettings,
    store: Any = None,
    events: list[RolloutEvent] | None = None,
    step: int = 0,
) -> tuple[RolloutBatch, Any]:
    store = store if store is not None else memory_store()
    async with gateway_runner(
        renderer=TOY,
        source=source,
        harness=harness,
        backend=backend,
        store=store,
        settings=rollout,
        sampler=sampler,
        on_event=None if events is None else events.append,
    ) as (runner, gateway):
        batch = await runner.run(tasks, step=step)
        assert gateway.engine._sessions == {}, "every session's live state was released"
    return batch, store


# ------------------------------------------------------------------ the real stack


@pytest.fixture
def jsonl_source(tmp_path: Path) -> Any:
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"id": "add", "question": "What is 1+1?", "answer": "2"},
        {"id": "mul", "question": "What is 2*3?", "answer": "6"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return PLUGINS.get("task_source", "jsonl").build({"path": str(path)})


def single_turn() -> Any:
    return PLUGINS.get("harness", "single-turn").build({"max_retries": 0})


def answers(script: dict[str, list[str]]) -> Callable[[Any], str]:
    """A sampler script answering each question from its own list, in call order."""

    def reply(request: Any) -> str:
        prompt = TOY.tokenizer.decode(request.prompt_token_ids)
        for question, replies in script.items():
            if question in prompt:
                return replies.pop(0)
        raise AssertionError(f"unexpected prompt {prompt!r}")

    return reply


def test_groups_hold_graded_episodes_whose_tokens_are_what_the_sampler_produced(jsonl_source):
    sampler = ScriptedSampler(
        answers({"1+1": ["2", "3"], "2*3": ["6", "6"]}), renderer=TOY, weight_version=7
    )
    enforced = SamplingParams(max_tokens=16, temperature=0.5)
    batch, store = asyncio.run(
        run_batch(
            list(jsonl_source.tasks("train")),
            sampler=sampler,
            harness=single_turn(),
            source=jsonl_source,
            rollout=settings(max_concurrency=1, enforced=enforced),
            step=3,
        )
    )
    assert [[e.task_id for e in group] for group in batch.groups] == [["add", "add"], ["mul"] * 2]
    assert [[e.reward for e in group] for group in batch.groups] == [[1.0, 0.0], [1.0, 1.0]]
    assert batch.infra_failures == [] and batch.retries == 0 and batch.episodes_done == 4
    assert batch.wall_s > 0
    sessions = [e.session_id for group in batch.groups for e in group]
    assert sessions == [
        "run-1-s3-add-0-a0",
        "run-1-s3-add-1-a0",
        "run-1-s3-mul-0-a0",
        "run-1-s3-mul-1-a0",
    ]
    # One request per episode, in order (concurrency 1), each with the enforced settings.
    assert len(sampler.requests) == 4
    assert all(r.params.max_tokens == 16 and r.params.temperature == 0.5 for r in sampler.requests)
    replies = ["2", "3", "6", "6"]
    for episode, request, reply in zip(
        [e for group in batch.groups for e in group], sampler.requests, replies, strict=True
    ):
        assert episode.episode_id == episode.session_id
        assert episode.group_id == f"3-{episode.task_id}"
        assert episode.termination is Termination.DONE
        assert episode.signals == {"parsed": 1.0}
        assert episode.trace_counts.incomplete_chains == 0
        assert episode.metadata["answer"] == reply
        assert episode.metadata["harness"] == {"finish_reason": "stop"}
        assert (episode.metadata["step"], episode.metadata["attempt"]) == (3, 0)
        (trajectory,) = episode.trajectories
        (step,) = trajectory.steps
        completion = [*TOY.tokenizer.encode(reply), IM_END]
        assert step.prompt_token_ids == request.prompt_token_ids
        assert step.completion_token_ids == completion
        assert step.logprobs == [scripted_logprob(t, i) for i, t in enumerate(completion)]
        assert step.weight_version == 7
        assert [t.record.session_id for t in store.session(episode.session_id)] == [
            episode.session_id
        ], "the trace store keeps the session's traces after the runner released it"


def test_a_model_server_failure_is_retried_on_a_fresh_session(jsonl_source):
    calls = {"n": 0}

    def reply(request: Any) -> Any:
        calls["n"] += 1
        return RuntimeError("worker lost") if calls["n"] == 1 else "2"

    events: list[RolloutEvent] = []
    (task,) = [t for t in jsonl_source.tasks("train") if t.task_id == "add"]
    batch, _store = asyncio.run(
        run_batch(
            [task],
            sampler=ScriptedSampler(reply, renderer=TOY),
            harness=single_turn(),
            source=jsonl_source,
            rollout=settings(group_size=1),
            events=events,
        )
    )
    (episode,) = batch.groups[0]
    assert episode.reward == 1.0 and episode.session_id == "run-1-s0-add-0-a1"
    assert batch.retries == 1 and batch.infra_failures == []
    assert [(e.kind, e.attempt) for e in events] == [
        ("started", 0),
        ("retried", 0),
        ("started", 1),
        ("finished", 1),
    ]
    assert events[1].termination is Termination.MODEL_ERROR
    assert "model server failed (status 500)" in (events[1].error or "")


def test_empty_replies_end_no_model_call_which_is_masked_by_default(jsonl_source):
    (task,) = [t for t in jsonl_source.tasks("train") if t.task_id == "add"]
    batch, _ = asyncio.run(
        run_batch(
            [task],
            sampler=ScriptedSampler(lambda request: "", renderer=TOY),
            harness=single_turn(),
            source=jsonl_source,
            rollout=settings(group_size=2, mask=DEFAULT_MASK),
        )
    )
    assert batch.groups == [[]] and batch.retries == 2
    assert [(f.termination, f.attempt) for f in batch.infra_failures] == [
        (Termination.NO_MODEL_CALL, 1),
        (Termination.NO_MODEL_CALL, 1),
    ]
    assert "got an empty reply" in batch.infra_failures[0].error


def test_unmasked_no_model_call_is_graded_as_the_policys_failure(jsonl_source):
    (task,) = [t for t in jsonl_source.tasks("train") if t.task_id == "add"]
    batch, _ = asyncio.run(
        run_batch(
            [task],
            sampler=ScriptedSampler(lambda request: "", renderer=TOY),
            harness=single_turn(),
            source=jsonl_source,
            rollout=settings(group_size=2, mask=SCRIPTED_MASK),
        )
    )
    assert [(e.termination, e.reward) for e in batch.groups[0]] == [
        (Termination.MODEL_ERROR, 0.0),
        (Termination.MODEL_ERROR, 0.0),
    ]
    assert batch.retries == 0 and batch.infra_failures == []


# ------------------------------------------------------------------ fakes


class FakeSandbox:
    merges_output = False

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend
        self.closed = False

    async def exec(self, command: str, timeout: float, **kwargs: Any) -> ExecResult:
        self.backend.commands.append(command)
        return ExecResult(exit_code=0, stdout="", stderr="")

    async def close(self) -> None:
        self.closed = True

    async def is_alive(self) -> bool:
        return not self.closed


class FakeBackend:
    """Creates fake sandboxes; ``fail_creates`` makes that many creations fail first."""

    def __init__(self, fail_creates: int = 0, error: Exception | None = None) -> None:
        self.sandboxes: list[FakeSandbox] = []
        self.specs: list[SandboxSpec] = []
        self.commands: list[str] = []
        self.fail_creates = fail_creates
        self.error = error or SandboxCreateError("quota exceeded")

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        self.specs.append(spec)
        if self.fail_creates:
            self.fail_creates -= 1
            raise self.error
        sandbox = FakeSandbox(self)
        self.sandboxes.append(sandbox)
        return sandbox

    async def close(self) -> None:
        pass


class FakeHarness:
    """Plays ``behaviour(task, attempt_number)``: an outcome, or an exception to raise."""

    def __init__(self, behaviour: Callable[[Task, int], Any], delay_s: float = 0.0) -> None:
        self.behaviour = behaviour
        self.delay_s = delay_s
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.endpoints: list[LLMEndpoint] = []

    async def run(self, task: Task, llm: LLMEndpoint, sandbox: Any) -> HarnessOutcome:
        self.calls += 1
        self.endpoints.append(llm)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            result = self.behaviour(task, self.calls)
            if isinstance(result, BaseException):
                raise result
            return result
        finally:
            self.in_flight -= 1


class FakeSource:
    """Grades ``DONE`` with the task's ``data["reward"]`` and every other termination 0.25;
    ``grade_errors`` makes that many gradings raise first."""

    def __init__(self, grade_errors: list[Exception] | None = None) -> None:
        self.grade_errors = list(grade_errors or [])
        self.graded: list[tuple[str, Termination]] = []

    def tasks(self, split: str = "train") -> list[Task]:
        return []

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Any) -> Grade:
        if self.grade_errors:
            raise self.grade_errors.pop(0)
        self.graded.append((task.task_id, outcome.termination))
        if outcome.termination is Termination.DONE:
            return Grade(reward=task.data["reward"], signals={"seen": 1.0})
        return Grade(reward=0.25)


def sandboxed(task_id: str, reward: float = 1.0, **fields: Any) -> Task:
    return Task(
        task_id=task_id,
        instruction="do it",
        data={"reward": reward},
        environment=SandboxSpec(),
        **fields,
    )


def done(task: Task, call: int) -> HarnessOutcome:
    return HarnessOutcome(termination=Termination.DONE, turns=1, metadata={"call": call})


def test_a_sandbox_error_is_retried_then_scored_and_every_sandbox_is_closed():
    backend = FakeBackend()

    def behaviour(task: Task, call: int) -> Any:
        return SandboxGone("the container vanished") if call == 1 else done(task, call)

    harness = FakeHarness(behaviour)
    batch, _ = asyncio.run(
        run_batch(
            [sandboxed("t", reward=0.75)],
            harness=harness,
            source=FakeSource(),
            backend=backend,
            rollout=settings(group_size=1, max_infra_retries=2),
        )
    )
    (episode,) = batch.groups[0]
    assert (episode.reward, episode.termination, episode.signals) == (
        0.75,
        Termination.DONE,
        {"seen": 1.0},
    )
    assert episode.session_id == "run-1-s0-t-0-a1" and episode.metadata["attempt"] == 1
    assert episode.metadata["harness"] == {"call": 2}
    assert episode.trajectories == (), "the fake harness made no model call"
    assert batch.retries == 1 and batch.infra_failures == []
    assert len(backend.sandboxes) == 2 and all(s.closed for s in backend.sandboxes)
    assert [e.base_url.rsplit("/sessions/", 1)[1] for e in harness.endpoints] == [
        "run-1-s0-t-0-a0/v1",
        "run-1-s0-t-0-a1/v1",
    ]


def test_a_rollout_failing_on_every_attempt_is_excluded_not_scored():
    backend = FakeBackend()
    events: list[RolloutEvent] = []

    def behaviour(task: Task, call: int) -> Any:
        if task.task_id == "bad":
            return HarnessOutcome(
                termination=Termination.SANDBOX_ERROR, metadata={"error": "exec failed"}
            )
        return done(task, call)

    batch, _ = asyncio.run(
        run_batch(
            [sandboxed("bad"), sandboxed("good", reward=0.5)],
            harness=FakeHarness(behaviour),
            source=FakeSource(),
            backend=backend,
            rollout=settings(group_size=2, max_concurrency=1, max_infra_retries=2),
            events=events,
        )
    )
    assert batch.groups[0] == []
    assert [e.reward for e in batch.groups[1]] == [0.5, 0.5]
    assert batch.episodes_done == 2 and batch.retries == 4
    assert batch.infra_failures == [
        InfraFailure(
            task_id="bad",
            index=index,
            attempt=2,
            termination=Termination.SANDBOX_ERROR,
            error="the harness ended with sandbox_error: exec failed",
            session_id=f"run-1-s0-bad-{index}-a2",
        )
        for index in (0, 1)
    ]
    assert len(backend.sandboxes) == 8 and all(s.closed for s in backend.sandboxes)
    kinds = [e.kind for e in events]
    assert kinds.count("started") == 8 and kinds.count("retried") == 4
    assert kinds.count("failed") == 2 and kinds.count("finished") == 2
    assert [e.done for e in events if e.kind in ("failed", "finished")] == [1, 2, 3, 4]
    assert {e.total for e in events} == {4}


@pytest.mark.parametrize(
    ("error", "termination"),
    [
        (
            VerifierCrashed("test.sh exited 2", task_id="t", exit_code=2, output=""),
            Termination.VERIFIER_ERROR,
        ),
        (SandboxGone("gone during grading"), Termination.SANDBOX_ERROR),
        (
            VerifierTimeout("test.sh ran 5 s", task_id="t", timeout_s=5),
            Termination.VERIFIER_TIMEOUT,
        ),
        (
            RewardFileInvalid("not a number", task_id="t", path="reward.txt", content="x"),
            Termination.GRADING_ERROR,
        ),
        (
            RewardFileMissing("no reward file", task_id="t", searched=["reward.txt"]),
            Termination.GRADING_ERROR,
        ),
    ],
)
def test_grading_failures_are_infrastructure(error, termination):
    batch, _ = asyncio.run(
        run_batch(
            [sandboxed("t")],
            harness=FakeHarness(done),
            source=FakeSource(grade_errors=[error]),
            backend=FakeBackend(),
            rollout=settings(group_size=1, max_infra_retries=0),
        )
    )
    assert batch.groups == [[]]
    (failure,) = batch.infra_failures
    assert (failure.termination, failure.attempt) == (termination, 0)
    assert failure.error == f"{type(error).__name__}: {error}"


def test_create_and_setup_failures_are_infrastructure():
    backend = FakeBackend(fail_creates=1)
    setup = TaskSetupError(
        "setup step 1/1 exited 1", task_id="t", command="false", exit_code=1, output=""
    )

    class Preparing(FakeSource):
        async def prepare(self, task: Task, sandbox: Any) -> None:
            if not self.prepared:
                self.prepared = True
                raise setup

    source = Preparing()
    source.prepared = False
    batch, _ = asyncio.run(
        run_batch(
            [sandboxed("t")],
            harness=FakeHarness(done),
            source=source,
            backend=backend,
            rollout=settings(group_size=1, max_infra_retries=2),
        )
    )
    assert [e.session_id for e in batch.groups[0]] == ["run-1-s0-t-0-a2"]
    assert batch.retries == 2
    assert len(backend.sandboxes) == 2 and all(s.closed for s in backend.sandboxes)


@pytest.mark.parametrize(
    "error",
    [
        SandboxStartTimeout("the sandbox did not start in 60 s"),
        TaskSetupTimeout("build ran 9 s", task_id="t", command="make", exit_code=None, output=""),
    ],
)
def test_an_environment_that_does_not_start_in_time_has_its_own_reason(error):
    class Preparing(FakeSource):
        async def prepare(self, task: Task, sandbox: Any) -> None:
            if isinstance(error, TaskSetupTimeout):
                raise error

    backend = FakeBackend(fail_creates=isinstance(error, SandboxStartTimeout), error=error)
    batch, _ = asyncio.run(
        run_batch(
            [sandboxed("t")],
            harness=FakeHarness(done),
            source=Preparing(),
            backend=backend,
            rollout=settings(group_size=1, max_infra_retries=0),
        )
    )
    (failure,) = batch.infra_failures
    assert failure.termination is Termination.ENVIRONMENT_START_TIMEOUT


def test_an_agent_setup_timeout_from_the_harness_is_masked():
    def behaviour(task: Task, call: int) -> HarnessOutcome:
        return HarnessOutcome(
            termination=Termination.AGENT_SETUP_TIMEOUT, metadata={"error": "install ran 60 s"}
        )

    batch, _ = asyncio.run(
        run_batch(
            [sandboxed("t")],
            harness=FakeHarness(behaviour),
            source=FakeSource(),
            backend=FakeBackend(),
            rollout=settings(group_size=1, max_infra_retries=1),
        )
    )
    (failure,) = batch.infra_failures
    assert (failure.termination, failure.attempt) == (Termination.AGENT_SETUP_TIMEOUT, 1)
    assert failure.error == "the harness ended with agent_setup_timeout: install ran 60 s"


def test_an_unmasked_reason_is_scored_zero_at_once_and_a_masked_one_is_retried():
    def timeouts() -> FakeSource:
        return FakeSource(
            grade_errors=[VerifierTimeout("ran 5 s", task_id="t", timeout_s=5) for _ in range(2)]
        )

    unmasked = SCRIPTED_MASK - {Termination.VERIFIER_TIMEOUT}
    batch, _ = asyncio.run(
        run_batch(
            [sandboxed("t")],
            harness=FakeHarness(done),
            source=timeouts(),
            backend=FakeBackend(),
            rollout=settings(group_size=1, max_infra_retries=1, mask=unmasked),
        )
    )
    (episode,) = batch.groups[0]
    assert (episode.termination, episode.reward, episode.signals) == (
        Termination.VERIFIER_TIMEOUT,
        0.0,
        {},
    )
    assert episode.metadata["harness"]["error"] == "VerifierTimeout: ran 5 s"
    assert batch.retries == 0 and batch.infra_failures == []
    masked, _ = asyncio.run(
        run_batch(
            [sandboxed("t")],
            harness=FakeHarness(done),
            source=timeouts(),
            backend=FakeBackend(),
            rollout=settings(group_size=1, max_infra_retries=1),
        )
    )
    assert masked.groups == [[]] and masked.retries == 1
    assert [f.termination for f in masked.infra_failures] == [Termination.VERIFIER_TIMEOUT]


def test_a_mask_naming_a_policy_reason_is_refused():
    with pytest.raises(ValueError, match="mask holds done, the policy's own reason"):
        settings(mask=frozenset({Termination.DONE}))


def test_verifier_timeouts_past_the_cap_stop_the_run_naming_the_tasks_and_the_key():
    class Slow(FakeSource):
        async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Any) -> Grade:
            if task.task_id == "fine":
                return Grade(reward=1.0)
            raise VerifierTimeout("ran 5 s", task_id=task.task_id, timeout_s=5)

    async def main() -> None:
        async with gateway_runner(
            renderer=TOY,
            source=Slow(),
            harness=FakeHarness(done),
            backend=FakeBackend(),
            store=memory_store(),
            settings=settings(group_size=1, max_concurrency=1, max_verifier_timeouts=2),
        ) as (runner, _):
            batch = await runner.run([sandboxed("slow"), sandboxed("fine")], step=1)
            assert batch.infra_failures[0].termination is Termination.VERIFIER_TIMEOUT
            await runner.run([sandboxed("hang")], step=2)

    with pytest.raises(TooManyVerifierTimeouts) as info:
        asyncio.run(main())
    assert info.value.timeouts == {"slow": 2, "hang": 1}
    message = str(info.value)
    assert "3 rollout attempts ended verifier_timeout" in message
    assert "[rollout].max_verifier_timeouts = 2" in message
    assert "'slow' (2 times), 'hang' (1 time)" in message
    assert info.value.to_dict()["kind"] == "verifier_timeout"


def test_only_the_task_source_prepares_the_sandbox():
    class Preparing(FakeSource):
        async def prepare(self, task: Task, sandbox: Any) -> None:
            await sandbox.exec(f"touch {task.task_id}", timeout=5)

    task = Task(
        task_id="h",
        instruction="do it",
        data={"reward": 1.0, "task_dir": "/nowhere", "setup_commands": ["touch /app/x"]},
        environment=SandboxSpec(workdir="/app"),
    )
    for source, commands in ((FakeSource(), []), (Preparing(), ["touch h"])):
        backend = FakeBackend()
        batch, _ = asyncio.run(
            run_batch(
                [task],
                harness=FakeHarness(done),
                source=source,
                backend=backend,
                rollout=settings(group_size=1),
            )
        )
        assert batch.episodes_done == 1
        assert backend.commands == commands


def test_a_backend_that_builds_dockerfiles_gets_the_build_and_the_source_the_same_task():
    class Building(FakeBackend):
        builds_dockerfiles = True

    class Preparing(FakeSource):
        def __init__(self) -> None:
            super().__init__()
            self.prepared: list[SandboxSpec | None] = []

        async def prepare(self, task: Task, sandbox: Any) -> None:
            self.prepared.append(task.environment)

    dockerfile = "FROM alpine\nRUN touch /x\n"
    environment = SandboxSpec(
        image="alpine", dockerfile=dockerfile, replays_dockerfile=True, context_dir="/ctx"
    )
    task = Task(task_id="d", instruction="do it", data={"reward": 1.0}, environment=environment)
    for backend, image in ((Building(), None), (FakeBackend(), "alpine")):
        source = Preparing()
        batch, _ = asyncio.run(
            run_batch(
                [task],
                harness=FakeHarness(done),
                source=source,
                backend=backend,
                rollout=settings(group_size=1),
            )
        )
        assert batch.episodes_done == 1
        (spec,) = backend.specs
        (prepared,) = source.prepared
        assert (spec.image, spec.dockerfile, spec.context_dir) == (image, dockerfile, "/ctx")
        assert spec.replays_dockerfile is (image is not None)
        assert prepared is not None and prepared.image == image


def test_sandboxes_get_the_reproducible_environment_under_the_tasks_own(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AUTO,STRICT")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    backend = FakeBackend()
    own = Task(
        task_id="own",
        instruction="do it",
        data={"reward": 1.0},
        environment=SandboxSpec(env={"MKL_CBWR": "COMPATIBLE", "LANG": "C"}),
    )
    asyncio.run(
        run_batch(
            [own],
            harness=FakeHarness(done),
            source=FakeSource(),
            backend=backend,
            rollout=settings(group_size=1),
        )
    )
    (spec,) = backend.specs
    assert spec.env == {"MKL_CBWR": "COMPATIBLE", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "LANG": "C"}


class RelayingBackend(FakeBackend):
    """Sandboxes that reach a gateway-mode spec's gateway at their own URL (``relayed``), or,
    with ``relays=False``, do not implement the gateway network."""

    def __init__(self, relays: bool = True) -> None:
        super().__init__()
        self.relays = relays

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox = await super().create(spec)
        if self.relays:
            sandbox.gateway_url = f"http://127.0.0.1:1/relayed/{len(self.specs)}"  # type: ignore[attr-defined]
        return sandbox


@pytest.mark.parametrize(
    ("declared", "task_network", "created"),
    [
        (None, NetworkPolicy.NONE, NetworkPolicy.NONE),
        (NetworkPolicy.GATEWAY, NetworkPolicy.NONE, NetworkPolicy.GATEWAY),
        (NetworkPolicy.GATEWAY, NetworkPolicy.FULL, NetworkPolicy.FULL),
        (NetworkPolicy.FULL, NetworkPolicy.GATEWAY, NetworkPolicy.FULL),
    ],
)
def test_the_sandbox_gets_the_wider_of_the_tasks_and_the_harnesss_network(
    declared, task_network, created
):
    harness = FakeHarness(done)
    if declared is not None:
        harness.sandbox_network = declared  # type: ignore[attr-defined]
    backend = RelayingBackend()
    task = Task(
        task_id="net",
        instruction="do it",
        data={"reward": 1.0},
        environment=SandboxSpec(network=task_network),
    )
    batch, _ = asyncio.run(
        run_batch([task], harness=harness, source=FakeSource(), backend=backend, rollout=settings())
    )
    assert batch.episodes_done == 2
    for spec, llm in zip(backend.specs, harness.endpoints, strict=True):
        assert spec.network is created
        if created is NetworkPolicy.GATEWAY:
            # The spec names the session's own URL; the harness gets the sandbox's.
            assert spec.gateway_url is not None and spec.gateway_url.endswith("/v1")
            assert "/sessions/" in spec.gateway_url
            assert llm.base_url.startswith("http://127.0.0.1:1/relayed/")
        else:
            assert spec.gateway_url is None
            assert "/sessions/" in llm.base_url


def test_a_sandbox_without_the_gateway_network_fails_the_attempt_as_a_sandbox_error():
    harness = FakeHarness(done)
    harness.sandbox_network = NetworkPolicy.GATEWAY  # type: ignore[attr-defined]
    task = Task(task_id="t", instruction="x", data={"reward": 1.0}, environment=SandboxSpec())
    batch, _ = asyncio.run(
        run_batch(
            [task],
            harness=harness,
            source=FakeSource(),
            backend=RelayingBackend(relays=False),
            rollout=settings(group_size=1, max_infra_retries=0),
        )
    )
    assert harness.calls == 0
    [failure] = batch.infra_failures
    assert failure.termination is Termination.SANDBOX_ERROR
    assert "has no gateway_url" in failure.error


def test_the_concurrency_bound_holds_over_the_whole_batch():
    harness = FakeHarness(done, delay_s=0.05)
    batch, _ = asyncio.run(
        run_batch(
            [sandboxed(f"t{k}") for k in range(3)],
            harness=harness,
            source=FakeSource(),
            backend=FakeBackend(),
            rollout=settings(group_size=4, max_concurrency=3),
        )
    )
    assert batch.episodes_done == 12 and harness.calls == 12
    assert harness.max_in_flight == 3


def test_a_harness_past_its_deadline_is_cancelled_and_scored_as_timeout():
    harness = FakeHarness(done, delay_s=30.0)
    source = FakeSource()
    batch, _ = asyncio.run(
        run_batch(
            [sandboxed("slow", agent_timeout_s=0.05)],
            harness=harness,
            source=source,
            backend=FakeBackend(),
            rollout=settings(group_size=1, deadline_margin_s=0.05),
        )
    )
    (episode,) = batch.groups[0]
    assert (episode.termination, episode.reward) == (Termination.TIMEOUT, 0.25)
    assert "0.1 s deadline" in episode.metadata["harness"]["error"]
    assert source.graded == [("slow", Termination.TIMEOUT)]
    assert batch.wall_s < 10


def test_cancelling_a_run_closes_every_sandbox_and_raises_cancelled():
    backend = FakeBackend()

    async def main() -> None:
        entered = asyncio.Event()
        harness = FakeHarness(done, delay_s=3600.0)
        original = harness.run

        async def run(task: Task, llm: LLMEndpoint, sandbox: Any) -> HarnessOutcome:
            if harness.in_flight + 1 == 4:
                entered.set()
            return await original(task, llm, sandbox)

        harness.run = run  # type: ignore[method-assign]
        async with gateway_runner(
            renderer=TOY,
            source=FakeSource(),
            harness=harness,
            backend=backend,
            store=memory_store(),
            settings=settings(group_size=4, max_concurrency=4),
        ) as (runner, gateway):
            job = asyncio.create_task(runner.run([sandboxed("t"), sandboxed("u")], step=0))
            await asyncio.wait_for(entered.wait(), 10)
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(job, 10)
            assert gateway.engine._sessions == {}

    asyncio.run(main())
    assert len(backend.sandboxes) == 4, "only max_concurrency sandboxes were ever created"
    assert all(s.closed for s in backend.sandboxes)


def test_an_unexpected_error_aborts_the_batch_after_closing_sandboxes():
    backend = FakeBackend()

    def behaviour(task: Task, call: int) -> Any:
        return KeyError("bug in the harness") if task.task_id == "bug" else done(task, call)

    with pytest.raises(KeyError, match="bug in the harness"):
        asyncio.run(
            run_batch(
                [sandboxed("ok"), sandboxed("bug")],
                harness=FakeHarness(behaviour, delay_s=0.01),
                source=FakeSource(),
                backend=backend,
                rollout=settings(group_size=2),
            )
        )
    assert backend.sandboxes and all(s.closed for s in backend.sandboxes)


def test_a_sandbox_auth_error_aborts_instead_of_retrying():
    backend = FakeBackend(fail_creates=5, error=SandboxAuthError("token rejected"))
    with pytest.raises(SandboxAuthError):
        asyncio.run(
            run_batch(
                [sandboxed("t")],
                harness=FakeHarness(done),
                source=FakeSource(),
                backend=backend,
                rollout=settings(group_size=1, max_infra_retries=3),
            )
        )
    assert backend.fail_creates == 4, "created once, never retried"


def test_a_task_without_environment_gets_no_sandbox_and_an_event_handler_error_is_ignored(
    caplog,
):
    seen: list[Any] = []

    def behaviour(task: Task, call: int) -> HarnessOutcome:
        return done(task, call)

    harness = FakeHarness(behaviour)
    original = harness.run

    async def run(task: Task, llm: LLMEndpoint, sandbox: Any) -> HarnessOutcome:
        seen.append(sandbox)
        return await original(task, llm, sandbox)

    harness.run = run  # type: ignore[method-assign]

    def broken(event: RolloutEvent) -> None:
        raise RuntimeError("display crashed")

    async def main() -> RolloutBatch:
        async with gateway_runner(
            renderer=TOY,
            source=FakeSource(),
            harness=harness,
            backend=None,
            store=memory_store(),
            settings=settings(group_size=1),
            on_event=broken,
        ) as (runner, _):
            return await runner.run(
                [Task(task_id="plain", instruction="hi", data={"reward": 1})], step=0
            )

    with caplog.at_level(logging.ERROR, logger="rllm_core.rollout"):
        batch = asyncio.run(main())
    assert seen == [None]
    assert [e.reward for e in batch.groups[0]] == [1.0]
    assert "the rollout event handler failed on a started event" in caplog.text


def test_duplicate_task_ids_and_an_empty_batch():
    async def main(tasks: list[Task]) -> RolloutBatch:
        batch, _ = await run_batch(
            tasks, harness=FakeHarness(done), source=FakeSource(), rollout=settings()
        )
        return batch

    with pytest.raises(ValueError, match="task id 'a' appears twice"):
        asyncio.run(main([Task(task_id="a", instruction=""), Task(task_id="a", instruction="")]))
    empty = asyncio.run(main([]))
    assert (empty.groups, empty.infra_failures, empty.retries, empty.episodes_done) == (
        [],
        [],
        0,
        0,
    )


def test_session_ids_are_safe_for_the_gateway_and_distinct():
    assert rollout_session_id("run 1", 2, "a/b c", 3, 0) == "run_1-s2-a_b_c-3-a0"
    assert rollout_session_id("-x", 0, "t", 0, 1) == "r-x-s0-t-0-a1"
    long_a = rollout_session_id("r", 0, "t" * 300, 0, 0)
    long_b = rollout_session_id("r", 0, "t" * 300, 1, 0)
    assert len(long_a) == len(long_b) == 256 and long_a != long_b
    assert long_a.startswith("r-s0-ttt")


@pytest.mark.parametrize(
    ("key", "task"),
    [
        (SessionKey("run-1", 3, "t-7", 1, 2), "t-7"),
        (SessionKey("my run/1", 12, "a/b c", 0, 0), "a_b_c"),
        (SessionKey("-x", 0, "t", 0, 1), "t"),
        (SessionKey("r" * 400, 5, "task", 3, 1), "task"),
        (SessionKey("r", 9, "t" * 300, 4, 2), None),
    ],
)
def test_a_session_key_encodes_to_a_gateway_id_and_parses_back(key, task):
    session_id = key.encode()
    assert is_session_id(session_id)
    parsed = SessionKey.parse(session_id, run=key.run)
    assert parsed is not None
    assert (parsed.run, parsed.step, parsed.index, parsed.attempt) == (
        key.run,
        key.step,
        key.index,
        key.attempt,
    )
    if task is not None:
        assert parsed.task == task
    else:
        assert parsed.task.startswith("ttt") and len(session_id) == 256
    assert parsed.encode() == session_id
    assert parsed.tail() == key.tail()


def test_parse_finds_no_key_in_another_runs_or_a_foreign_id():
    session_id = SessionKey("run-1", 1, "t", 0, 0).encode()
    assert SessionKey.parse(session_id, run="run-2") is None
    assert SessionKey.parse("run-1-chat", run="run-1") is None
    assert SessionKey.parse("run-1-s1-t-0-a", run="run-1") is None


def test_the_session_seed_ignores_the_run_name_and_separates_rollouts():
    a = SessionKey("run 1", 2, "t", 0, 0)
    assert session_seed(7, a) == session_seed(7, SessionKey("run-2", 2, "t", 0, 0))
    others = [SessionKey("run 1", 2, "t", 1, 0), SessionKey("run 1", 3, "t", 0, 0)]
    assert session_seed(7, a) not in {session_seed(7, k) for k in others}
    assert session_seed(7, a) != session_seed(8, a)


def test_the_gateway_and_its_seeded_view_are_what_the_runner_uses():
    store = memory_store()
    gateway = Gateway(renderer=TOY, sampler=ScriptedSampler(["x"], renderer=TOY), trace_store=store)
    seeded = SeededGateway(gateway, seed=3, run_id="my run")
    assert isinstance(gateway, SessionGateway) and isinstance(seeded, SessionGateway)
    key = SessionKey("my run", 1, "t", 0, 0)
    seeded.configure_session(key.encode(), enforced=SamplingParams(max_tokens=5))
    assert gateway.engine._sessions[key.encode()].enforced == SamplingParams(
        max_tokens=5, seed=session_seed(3, key)
    )
    seeded.release_session(key.encode())
    assert key.encode() not in gateway.engine.session_ids()


@pytest.mark.parametrize(
    ("metadata", "infra"),
    [
        ({"status": 502, "error_type": "InternalServerError"}, True),
        ({"status": 500}, True),
        ({"error_type": "APIConnectionError"}, True),
        ({"error_type": "APITimeoutError"}, True),
        ({"status": 429, "error_type": "RateLimitError"}, False),
        ({"error": "the model's reply is empty", "finish_reason": "stop"}, False),
        ({"status": True}, False),
    ],
)
def test_model_errors_are_infrastructure_only_when_the_server_failed(metadata, infra):
    outcome = HarnessOutcome(termination=Termination.MODEL_ERROR, metadata=metadata)
    failure = infra_outcome(outcome)
    assert (failure is not None) is infra
    if failure is not None:
        assert failure.termination is Termination.MODEL_ERROR
    done_outcome = HarnessOutcome(termination=Termination.DONE, metadata=metadata)
    assert infra_outcome(done_outcome) is None


def test_settings_reject_impossible_values():
    with pytest.raises(ValueError, match="group_size must be at least 1, got 0"):
        RolloutSettings(group_size=0, max_concurrency=1, max_infra_retries=0)
    with pytest.raises(ValueError, match="max_concurrency must be at least 1, got 0"):
        RolloutSettings(group_size=1, max_concurrency=0, max_infra_retries=0)
    with pytest.raises(ValueError, match="max_infra_retries must be 0 or more, got -1"):
        RolloutSettings(group_size=1, max_concurrency=1, max_infra_retries=-1)
