"""Conformance suite for harnesses (:class:`rllm_core.ports.Harness`).

Every check runs the harness for real: against a real gateway on an ephemeral port whose
sampler is a scripted fake model (:class:`~rllm_core.testing.samplers.ScriptedSampler`), in a
real sandbox when the harness needs one. A harness's test module subclasses
:class:`HarnessConformance` and provides the fixtures below::

    import pytest
    from reference.toy_renderer import ToyChatRenderer
    from rllm_core.testing.suites.harnesses import HarnessConformance
    from rllm_core.types import SandboxSpec, Task

    class TestShellHarness(HarnessConformance):
        needs_sandbox = True      # the suite builds the installed `local` sandbox backend
        max_turns = 3             # the turn limit the `harness` fixture is configured with
        endless_reply = "```bash\\ntrue\\n```"       # an action that never ends the episode
        slow_reply = "```bash\\nsleep 60\\n```"      # an action that keeps the harness busy

        @pytest.fixture
        def harness(self):
            return ShellHarness(ShellConfig(max_turns=3, max_retries=0))

        @pytest.fixture
        def harness_task(self, tmp_path):
            return Task(task_id="t", instruction="Make a file.",
                        environment=SandboxSpec(workdir=str(tmp_path / "w")))

        @pytest.fixture
        def harness_script(self):
            return ["```bash\\ntouch made\\n```", "DONE"]

        @pytest.fixture
        def gateway_renderer(self):
            return ToyChatRenderer()

The fixtures:

- ``harness`` (required): the harness, configured to end quickly: a turn limit of a few turns
  (declared in ``max_turns``), few or no retries of a failed model call, short timeouts. A
  fresh one per test.
- ``harness_task`` (required): a task the harness can run; with an ``environment`` when the
  harness acts in a sandbox.
- ``harness_script`` (required): the completions the fake model returns, in order, one per
  model call. Each is completion text, in the harness's own action format (a shell command in
  a fence, a tool call as the model would write it, the done marker...), encoded with the
  gateway's renderer and closed with its stop token. A run of the script must end the episode
  with ``script_termination`` (``DONE`` unless declared) after exactly ``len(script)`` model
  calls. A harness that calls the model outside the agent's turns (a summary, say) counts
  those calls too: script them. A reply may also be a list of token ids, used as given
  (leave out the stop token to script a completion cut at ``max_tokens``). A tool call is
  written as the renderer spells one in text (the toy renderer:
  ``<tool_call>\\n{"name": "bash", "arguments": {"command": "ls"}}\\n</tool_call>``), so the
  gateway parses it back into ``tool_calls``.
- ``gateway_renderer`` (required): the renderer the gateway renders chats with. In this
  repository, ``reference.toy_renderer.ToyChatRenderer()``; elsewhere any renderer whose
  ``encode`` turns the script's text into tokens (the ``chatml`` renderer over a tokenizer
  folder of :mod:`rllm_core.testing.tokenizers`, for instance).
- ``gateway_trace_store`` (optional): where the gateway records traces; by default the
  installed ``memory`` trace store (the test is skipped without it).
- ``sandbox_backend`` (optional): the backend each run's sandbox comes from, created as the
  rollout creates it (the task's environment with the network the harness declares in
  ``sandbox_network``, and the endpoint the sandbox reaches the gateway at) and closed after
  the run; the suite closes the backend after the test.
  By default: ``None`` (the harness gets ``sandbox=None``), or, with ``needs_sandbox = True``,
  the installed ``local`` backend with ``isolation = "none"`` (plain subprocesses in a
  folder), skipped when it is not installed. Override it for another backend.
- ``graded_task`` (optional): a :class:`GradedTask`, a task whose verifier grades what the
  agent left in its sandbox (a shipped Harbor shell task), with its task source and a shell
  command that solves it. Without it the hostile-agent checks are skipped.
- ``agent_running`` (optional): a function that takes a bash script and returns a harness
  whose agent runs it once in its sandbox, with the script of the fake model for
  that run (:data:`AgentRunning`): for a shell harness, a reply that is the command, then the
  done marker; for an agent program, an install and invocation that run it. Without it the
  hostile-agent checks are skipped.
- ``graded_sandbox_backend`` (optional): the backend of the graded runs; by default the
  installed ``local`` backend isolated by bubblewrap (``isolation = "bwrap"``), since a task's
  verifier folders are the sandbox's own ``/logs`` and ``/tests``.

The class attributes:

- ``script_termination``: how a run of ``harness_script`` ends (``Termination.DONE``).
- ``max_turns``: the turn limit of the ``harness`` fixture, checked exactly when set.
- ``endless_reply``: a valid action that does not end the episode (the shell harness's
  ``true`` command). The fake model answers it to every call, and the run must end with
  ``endless_termination`` (``MAX_TURNS``; a harness that maps its limit to another
  termination declares it), after ``max_turns`` calls when set. ``None`` skips that check.
- ``slow_reply``: a valid action that keeps the harness busy for a long time (a ``sleep 60``
  command); the run is cancelled while it runs. ``None`` skips that check.
- ``deadline_s``: the most a run may take before it counts as hung; ``cancel_deadline_s``:
  how soon a cancelled run must end; ``process_grace_s``: how soon the processes it started
  must be gone after that.

What the checks hold the harness to (each is a ``test_*`` method, also callable directly
with its fixtures as arguments):

- a run returns a :class:`~rllm_core.types.HarnessOutcome` whose ``termination`` is a
  :class:`~rllm_core.types.Termination`;
- ``turns`` equals the model calls the gateway recorded for the session;
- a model that never finishes ends the episode at the harness's limit, without hanging;
- a failing model (the gateway answers 502) and an unreachable endpoint each end the episode
  with ``MODEL_ERROR``; neither raises;
- a cancelled run, during a model call or during an action, raises ``CancelledError`` (or
  returns an outcome) within ``cancel_deadline_s`` and leaves no process of this test's
  process tree behind (read from ``/proc``; a sandbox whose processes run elsewhere, in a
  remote container, is checked only for the prompt end);
- every model call goes to the session's endpoint: the gateway records calls of that session
  only, and a trap server named in ``OPENAI_BASE_URL`` and ``OPENAI_API_BASE`` (with a wrong
  ``OPENAI_API_KEY``) in this process's environment during the run receives nothing.
- an agent that tries to forge its reward, each of the sandbox suite's
  :data:`~rllm_core.testing.suites.sandboxes.HOSTILE_AGENTS` (with ``ROOT``, ``LOGS`` and
  ``TESTS`` naming the graded task's verifier folders), played through the rollout
  (:class:`~rllm_core.rollout.RolloutRunner`: the sandbox with the network the harness
  declares, the task source's preparation, the agent's processes ended, the task source's
  verifier) scores 0 or is excluded as a verifier or sandbox error, never rewarded; an agent
  that runs the task's solution the same way scores 1.

A check the harness does not meet for a known reason is overridden in the subclass and
marked as an expected failure, with the reason and ``raises=AssertionError`` (so that a
broken fixture still fails)::

    @pytest.mark.xfail(strict=True, raises=AssertionError, reason="turns=0 without ...")
    def test_turns_equal_the_recorded_model_calls(
        self, harness, harness_task, harness_script, gateway_renderer, gateway_trace_store,
        sandbox_backend,
    ):
        super().test_turns_equal_the_recorded_model_calls(
            harness, harness_task, harness_script, gateway_renderer, gateway_trace_store,
            sandbox_backend,
        )

Checks drive the harness with :func:`asyncio.run` in plain synchronous tests, so no async
pytest plugin is needed. :meth:`HarnessConformance.play` and :func:`scripted_gateway` are
public for a harness's own end-to-end tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.server
import os
import posixpath
import shlex
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest

from rllm_core.errors import UnknownComponentError, UpstreamError
from rllm_core.gateway.server import Gateway
from rllm_core.plugins import ComponentSpec, PluginManager
from rllm_core.ports import Harness, Renderer, Sandbox, SandboxBackend, TaskSource, TraceStore
from rllm_core.rollout import RolloutBatch, RolloutRunner, RolloutSettings
from rllm_core.rollout.network import agent_endpoint, sandbox_spec
from rllm_core.testing.samplers import Script, ScriptedSampler
from rllm_core.testing.suites.sandboxes import HOSTILE_AGENTS, run_with_deadline
from rllm_core.types import (
    HarnessOutcome,
    LLMEndpoint,
    SampleRequest,
    SandboxSpec,
    Task,
    Termination,
    Trace,
)

__all__ = ["AgentRunning", "GradedTask", "HarnessConformance", "Played", "scripted_gateway"]

SESSION_ID = "conformance-episode"

T = TypeVar("T")


@contextlib.contextmanager
def scripted_gateway(
    script: Script,
    renderer: Renderer,
    trace_store: TraceStore,
    *,
    delay_s: float = 0.0,
    **options: Any,
) -> Iterator[tuple[Gateway, ScriptedSampler]]:
    """Serve a gateway (in a background thread, on an ephemeral port) whose fake model answers
    from ``script``; yields it with its sampler and stops it on exit. ``options`` go to
    :class:`~rllm_core.gateway.server.Gateway`."""
    sampler = ScriptedSampler(script, renderer=renderer, delay_s=delay_s)
    options.setdefault("stop_timeout_s", 2.0)
    server = Gateway(renderer=renderer, sampler=sampler, trace_store=trace_store, **options)
    server.start()
    try:
        yield server, sampler
    finally:
        server.stop()


@dataclass
class Played:
    """What one run left behind: the outcome, the traces the gateway recorded for the session
    and the requests the fake model received (each names its session)."""

    outcome: HarnessOutcome
    session_id: str
    recorded: list[Trace] = field(default_factory=list)
    requests: list[SampleRequest] = field(default_factory=list)


@dataclass(frozen=True)
class GradedTask:
    """A task whose verifier grades what the agent left in the sandbox: the ``source`` that
    lists, prepares and grades it, the ``task``, a ``solution`` (a bash script) that solves it
    when run in the task's workdir, and ``verifier_root``, the folder of the sandbox holding the
    verifier's ``logs/verifier`` and ``tests`` (``/`` for a Harbor task)."""

    source: TaskSource
    task: Task
    solution: str
    verifier_root: str = "/"


AgentRunning = Callable[[str], tuple[Harness, Script]]
"""Takes a bash script; returns a harness whose agent runs it once in the sandbox (in the
task's workdir) and the script of the fake model that makes it do so."""


@dataclass
class _GradedRun:
    batch: RolloutBatch
    model_calls: int
    script_length: int


class _Blocked:
    """A scripted reply that holds the model call open until released, then fails it."""

    def __init__(self) -> None:
        self.released = threading.Event()

    async def __call__(self, request: SampleRequest) -> BaseException:
        while not self.released.is_set():
            await asyncio.sleep(0.02)
        return UpstreamError("the conformance test released a blocked model call")


class _Trap(http.server.BaseHTTPRequestHandler):
    """Records every request and answers 404: no harness may call it."""

    hits: list[str]

    def _record(self) -> None:
        self.hits.append(f"{self.command} {self.path}")
        body = b'{"error": {"message": "not the session endpoint"}}'
        self.send_response(404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _record

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _trap_server() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    handler = type("Trap", (_Trap,), {"hits": hits})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", hits
    finally:
        server.shutdown()
        server.server_close()


@functools.cache
def _installed(kind: str, name: str) -> ComponentSpec | None:
    """The installed component ``kind:name``, or ``None``. A plugin that fails to load is left
    out (with its warning) rather than failing a suite that does not use it."""
    try:
        return PluginManager(strict=False).get(kind, name)
    except UnknownComponentError:
        return None


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _descendants() -> set[int] | None:
    """The live (not zombie) processes below this one, from ``/proc``; ``None`` without it."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    children: dict[int, list[int]] = {}
    zombies: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        pid = int(entry.name)
        children.setdefault(int(ppid), []).append(pid)
        if state == "Z":
            zombies.add(pid)
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found - zombies


def _command_of(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120] or "?"


class _Hung(Exception):
    """A run went past its deadline."""


async def _within(coro: Coroutine[Any, Any, T], deadline_s: float) -> T:
    """Await ``coro``; past ``deadline_s`` cancel it (waiting a little for it to unwind) and
    raise :class:`_Hung`."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=deadline_s)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=5.0)
        raise _Hung
    return task.result()


async def _until(condition: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _assert_turns(played: Played) -> None:
    turns = played.outcome.turns
    assert isinstance(turns, int), f"turns must be an int, got {turns!r}"
    assert turns == len(played.recorded), (
        f"the outcome says turns={turns} but the gateway recorded {len(played.recorded)} model"
        f" calls for the session ({len(played.requests)} requests reached the model; a request"
        " repeated with the same prompt is recorded once); count every model call as a turn"
    )


def _ended(run: asyncio.Future[Any]) -> str:
    """How a finished run ended, for a failure message."""
    if run.cancelled():
        return "it was cancelled"
    error = run.exception()
    if error is not None:
        return f"it raised {type(error).__qualname__}: {error}"
    return f"it returned {run.result()!r}"


class HarnessConformance:
    """Abstract tests of a :class:`~rllm_core.ports.Harness`; see the module docstring for the
    fixtures to provide and the attributes to declare."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.rllm_conformance]

    script_termination: ClassVar[Termination] = Termination.DONE
    max_turns: ClassVar[int | None] = None
    endless_reply: ClassVar[str | None] = None
    endless_termination: ClassVar[Termination] = Termination.MAX_TURNS
    slow_reply: ClassVar[str | None] = None
    needs_sandbox: ClassVar[bool] = False
    deadline_s: ClassVar[float] = 30.0
    cancel_deadline_s: ClassVar[float] = 5.0
    process_grace_s: ClassVar[float] = 3.0

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture
    def gateway_trace_store(self) -> Iterator[TraceStore]:
        spec = _installed("trace_store", "memory")
        if spec is None:
            pytest.skip(
                "the `memory` trace store is not installed (rllm-trace-store-deltachain);"
                " install it or override the gateway_trace_store fixture"
            )
        store = spec.build({})
        yield store
        store.close()

    @pytest.fixture
    def sandbox_backend(self) -> Iterator[SandboxBackend | None]:
        if not self.needs_sandbox:
            yield None
            return
        spec = _installed("sandbox_backend", "local")
        if spec is None:
            pytest.skip(
                "the harness needs a sandbox and the `local` sandbox backend is not installed"
                " (rllm-sandbox-backend-local); install it or override the sandbox_backend"
                " fixture"
            )
        backend = spec.build({"isolation": "none"})
        yield backend
        run_with_deadline(backend.close(), self.deadline_s)

    @pytest.fixture
    def graded_task(self) -> GradedTask:
        pytest.skip(
            "the graded_task fixture is not provided: give a task whose verifier grades the"
            " sandbox (a GradedTask) to play the hostile agents"
        )

    @pytest.fixture
    def agent_running(self) -> AgentRunning:
        pytest.skip(
            "the agent_running fixture is not provided: give a function that makes the"
            " harness's agent run a shell command (AgentRunning) to play the hostile agents"
        )

    @pytest.fixture
    def graded_sandbox_backend(self) -> Iterator[SandboxBackend]:
        spec = _installed("sandbox_backend", "local")
        if spec is None:
            pytest.skip(
                "the graded runs need a sandbox and the `local` sandbox backend is not"
                " installed (rllm-sandbox-backend-local); install it or override the"
                " graded_sandbox_backend fixture"
            )
        backend = spec.build({"isolation": "bwrap"})
        yield backend
        run_with_deadline(backend.close(), self.deadline_s)

    # ------------------------------------------------------------------ helpers

    @contextlib.asynccontextmanager
    async def open_sandbox(
        self, backend: SandboxBackend | None, task: Task, harness: Harness, llm: LLMEndpoint
    ) -> AsyncIterator[tuple[Sandbox | None, LLMEndpoint]]:
        """A sandbox for one run of ``task`` (``None`` without a backend), closed after, and
        ``llm`` as the harness gets it: both as the rollout makes them, with the network the
        harness declares (:mod:`rllm_core.rollout.network`)."""
        if backend is None:
            yield None, llm
            return
        spec = sandbox_spec(task.environment or SandboxSpec(), harness, llm)
        sandbox = await backend.create(spec)
        try:
            yield sandbox, agent_endpoint(spec, sandbox, llm)
        finally:
            await sandbox.close()

    def play(
        self,
        harness: Harness,
        task: Task,
        script: Script,
        *,
        renderer: Renderer,
        trace_store: TraceStore,
        backend: SandboxBackend | None,
    ) -> Played:
        """Run one episode against a gateway answering from ``script``; fails the test when
        the run raises or takes longer than ``deadline_s``."""
        with scripted_gateway(script, renderer, trace_store) as (gateway, sampler):

            async def body() -> HarnessOutcome:
                endpoint = gateway.endpoint(SESSION_ID)
                async with self.open_sandbox(backend, task, harness, endpoint) as (sandbox, llm):
                    return await harness.run(task, llm, sandbox)

            outcome = self._finish(body(), "the scripted run", sampler)
            return Played(
                outcome=outcome,
                session_id=SESSION_ID,
                recorded=trace_store.session(SESSION_ID),
                requests=list(sampler.requests),
            )

    def play_graded(
        self,
        graded: GradedTask,
        command: str,
        agent_running: AgentRunning,
        *,
        renderer: Renderer,
        trace_store: TraceStore,
        backend: SandboxBackend,
    ) -> _GradedRun:
        """Roll out ``graded.task`` once, as a run does, with the harness ``agent_running``
        makes for ``command``, which runs with ``ROOT``, ``LOGS`` and ``TESTS`` set to the
        verifier's folders."""
        root = graded.verifier_root
        folders = {
            "ROOT": root,
            "LOGS": posixpath.join(root, "logs", "verifier"),
            "TESTS": posixpath.join(root, "tests"),
        }
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in folders.items())
        harness, script = agent_running(f"export {exports}\n{command}")
        sampler = ScriptedSampler(script, renderer=renderer)

        async def body() -> RolloutBatch:
            async with Gateway(renderer=renderer, sampler=sampler, trace_store=trace_store) as gw:
                runner = RolloutRunner(
                    task_source=graded.source,
                    harness=harness,
                    sandbox_backend=backend,
                    gateway=gw,
                    trace_store=trace_store,
                    settings=RolloutSettings(group_size=1, max_concurrency=1, max_infra_retries=0),
                    run_id="conformance-graded",
                )
                return await runner.run([graded.task], step=0)

        batch = run_with_deadline(body(), 2 * self.deadline_s)
        length = len(script) if isinstance(script, Sequence) else -1
        return _GradedRun(batch=batch, model_calls=sampler.calls, script_length=length)

    def _finish(
        self, coro: Coroutine[Any, Any, T], what: str, sampler: ScriptedSampler | None = None
    ) -> HarnessOutcome:
        try:
            outcome = asyncio.run(_within(coro, self.deadline_s))
        except _Hung:
            calls = f" after {sampler.calls} model calls" if sampler is not None else ""
            raise AssertionError(
                f"{what} did not end within {self.deadline_s:g} s{calls}: a harness must end"
                " every episode (at its turn limit, its time budget or a model error), never"
                " hang"
            ) from None
        except Exception as exc:
            raise AssertionError(
                f"{what} raised {type(exc).__module__}.{type(exc).__qualname__}: {exc}; a"
                " harness returns how the episode ended (a Termination) instead of raising"
            ) from exc
        assert isinstance(outcome, HarnessOutcome), (
            f"{what} returned {type(outcome).__name__}, not a HarnessOutcome"
        )
        assert isinstance(outcome.termination, Termination), (
            f"{what} returned termination {outcome.termination!r}, not a Termination"
        )
        return outcome

    def _check_script_used(self, played: Played, script: Sequence[Any]) -> None:
        used = len(played.requests)
        if used > len(script):
            raise AssertionError(
                f"the harness made {used} model calls but harness_script holds {len(script)}"
                f" replies (it ended with {played.outcome.termination.value},"
                f" metadata {played.outcome.metadata!r}); script every call the harness makes"
            )

    # ------------------------------------------------------------------ checks

    def test_is_a_harness(self, harness: Any) -> None:
        assert isinstance(harness, Harness), (
            f"{type(harness).__name__} has no `async def run(task, llm, sandbox)`"
        )

    def test_the_script_ends_with_an_outcome(
        self,
        harness: Harness,
        harness_task: Task,
        harness_script: Sequence[str],
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
        sandbox_backend: SandboxBackend | None,
    ) -> None:
        played = self.play(
            harness,
            harness_task,
            list(harness_script),
            renderer=gateway_renderer,
            trace_store=gateway_trace_store,
            backend=sandbox_backend,
        )
        self._check_script_used(played, harness_script)
        outcome = played.outcome
        assert outcome.termination is self.script_termination, (
            f"the scripted run ended with {outcome.termination.value}, expected"
            f" {self.script_termination.value} (metadata {outcome.metadata!r}); check that"
            " harness_script is in the harness's action format and ends the episode"
        )
        assert len(played.requests) == len(harness_script), (
            f"the harness made {len(played.requests)} model calls for a script of"
            f" {len(harness_script)} replies"
        )

    def test_turns_equal_the_recorded_model_calls(
        self,
        harness: Harness,
        harness_task: Task,
        harness_script: Sequence[str],
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
        sandbox_backend: SandboxBackend | None,
    ) -> None:
        played = self.play(
            harness,
            harness_task,
            list(harness_script),
            renderer=gateway_renderer,
            trace_store=gateway_trace_store,
            backend=sandbox_backend,
        )
        self._check_script_used(played, harness_script)
        _assert_turns(played)

    def test_a_model_that_never_finishes_ends_at_the_limit(
        self,
        harness: Harness,
        harness_task: Task,
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
        sandbox_backend: SandboxBackend | None,
    ) -> None:
        reply = self.endless_reply
        if reply is None:
            pytest.skip("endless_reply is not set: declare an action that never ends the episode")
        played = self.play(
            harness,
            harness_task,
            lambda request: reply,
            renderer=gateway_renderer,
            trace_store=gateway_trace_store,
            backend=sandbox_backend,
        )
        outcome = played.outcome
        assert outcome.termination is self.endless_termination, (
            f"a model that never finishes ended the episode with {outcome.termination.value}"
            f" after {len(played.requests)} calls, expected {self.endless_termination.value}"
            f" (metadata {outcome.metadata!r})"
        )
        _assert_turns(played)
        if self.max_turns is not None:
            assert len(played.requests) == self.max_turns, (
                f"the harness made {len(played.requests)} model calls; its limit is"
                f" max_turns={self.max_turns}"
            )

    def test_a_failing_model_ends_with_model_error(
        self,
        harness: Harness,
        harness_task: Task,
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
        sandbox_backend: SandboxBackend | None,
    ) -> None:
        def fail(request: SampleRequest) -> BaseException:
            return UpstreamError("the scripted model server failed")

        played = self.play(
            harness,
            harness_task,
            fail,
            renderer=gateway_renderer,
            trace_store=gateway_trace_store,
            backend=sandbox_backend,
        )
        assert played.requests, "the harness never called the model"
        assert played.outcome.termination is Termination.MODEL_ERROR, (
            f"a model call answered 502 ended the episode with"
            f" {played.outcome.termination.value}, expected model_error"
            f" (metadata {played.outcome.metadata!r})"
        )

    def test_an_unreachable_endpoint_ends_with_model_error(
        self, harness: Harness, harness_task: Task, sandbox_backend: SandboxBackend | None
    ) -> None:
        llm = LLMEndpoint(
            base_url=f"http://127.0.0.1:{_closed_port()}/sessions/{SESSION_ID}/v1",
            api_key="unreachable",
            model="policy",
        )

        async def body() -> HarnessOutcome:
            async with self.open_sandbox(sandbox_backend, harness_task, harness, llm) as (
                sandbox,
                inside,
            ):
                return await harness.run(harness_task, inside, sandbox)

        outcome = self._finish(body(), "a run against an unreachable endpoint")
        assert outcome.termination is Termination.MODEL_ERROR, (
            f"a run whose endpoint refuses connections ended with {outcome.termination.value},"
            f" expected model_error (metadata {outcome.metadata!r})"
        )

    def test_cancelled_during_a_model_call(
        self,
        harness: Harness,
        harness_task: Task,
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
        sandbox_backend: SandboxBackend | None,
    ) -> None:
        blocked = _Blocked()
        with scripted_gateway(blocked, gateway_renderer, gateway_trace_store) as (
            gateway,
            sampler,
        ):
            try:
                self._cancel(
                    harness,
                    harness_task,
                    gateway.endpoint(SESSION_ID),
                    sandbox_backend,
                    lambda: sampler.calls >= 1,
                    "during its first model call",
                )
            finally:
                blocked.released.set()

    def test_cancelled_during_an_action(
        self,
        harness: Harness,
        harness_task: Task,
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
        sandbox_backend: SandboxBackend | None,
    ) -> None:
        reply = self.slow_reply
        if reply is None:
            pytest.skip("slow_reply is not set: declare an action that keeps the harness busy")
        blocked = _Blocked()

        def script(request: SampleRequest) -> Any:
            return reply if len(sampler.requests) == 1 else blocked(request)

        with scripted_gateway(script, gateway_renderer, gateway_trace_store) as (
            gateway,
            sampler,
        ):
            try:
                self._cancel(
                    harness,
                    harness_task,
                    gateway.endpoint(SESSION_ID),
                    sandbox_backend,
                    lambda: sampler.calls >= 1,
                    "during the action of slow_reply",
                    settle_s=0.5,
                )
            finally:
                blocked.released.set()
            assert sampler.calls == 1, (
                f"the harness called the model again ({sampler.calls} calls) before it was"
                " cancelled: slow_reply must keep it busy for longer"
            )

    def _cancel(
        self,
        harness: Harness,
        task: Task,
        llm: LLMEndpoint,
        backend: SandboxBackend | None,
        ready: Callable[[], bool],
        when: str,
        *,
        settle_s: float = 0.0,
    ) -> None:
        """Start a run, cancel it once ``ready()`` holds (and ``settle_s`` more seconds have
        passed, for the harness to act on a reply) and check how it ends."""

        async def body() -> None:
            async with self.open_sandbox(backend, task, harness, llm) as (sandbox, inside):
                before = _descendants()
                run = asyncio.ensure_future(harness.run(task, inside, sandbox))
                try:
                    await self._cancel_when_ready(run, ready, when, settle_s)
                finally:
                    if not run.done():
                        run.cancel()
                        await asyncio.wait({run}, timeout=1.0)
                if before is not None:
                    await self._assert_no_process_left(before, when)

        run_with_deadline(body(), self.deadline_s + self.cancel_deadline_s)

    async def _cancel_when_ready(
        self, run: asyncio.Future[Any], ready: Callable[[], bool], when: str, settle_s: float
    ) -> None:
        await _until(lambda: ready() or run.done(), self.deadline_s)
        if not run.done() and not ready():
            raise AssertionError(
                f"the harness did not get to the point of being cancelled {when} within"
                f" {self.deadline_s:g} s"
            )
        await asyncio.wait({run}, timeout=settle_s)
        if run.done():
            raise AssertionError(
                f"the run ended before it could be cancelled {when}: {_ended(run)}"
            )
        run.cancel()
        done, _ = await asyncio.wait({run}, timeout=self.cancel_deadline_s)
        assert done, (
            f"the run cancelled {when} had not ended {self.cancel_deadline_s:g} s later; a"
            " harness must let cancellation through promptly"
        )
        if not run.cancelled():
            error = run.exception()
            if error is not None:
                raise AssertionError(
                    f"the run cancelled {when} raised {type(error).__qualname__}: {error}; let"
                    " CancelledError through (or return an outcome)"
                ) from error
            assert isinstance(run.result(), HarnessOutcome), (
                f"the run cancelled {when} returned {type(run.result()).__name__}, not a"
                " HarnessOutcome"
            )

    async def _assert_no_process_left(self, before: set[int], when: str) -> None:
        """Wait up to ``process_grace_s`` for the processes started since ``before`` to end;
        kill those that do not (they belong to this test) and fail naming them."""
        left: set[int] = set()

        def all_gone() -> bool:
            left.clear()
            left.update((_descendants() or set()) - before)
            return not left

        if await _until(all_gone, self.process_grace_s):
            return
        named = "; ".join(f"{pid} {_command_of(pid)}" for pid in sorted(left))
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(
            f"processes the run started still ran {self.process_grace_s:g} s after it was"
            f" cancelled {when} (killed now): {named}; end what the harness started when it"
            " is cancelled"
        )

    def test_model_calls_go_only_to_the_session_endpoint(
        self,
        harness: Harness,
        harness_task: Task,
        harness_script: Sequence[str],
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
        sandbox_backend: SandboxBackend | None,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        with _trap_server() as (trap_url, hits):
            for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
                monkeypatch.setenv(name, trap_url)
            monkeypatch.setenv("OPENAI_API_KEY", "not-the-session-key")
            played = self.play(
                harness,
                harness_task,
                list(harness_script),
                renderer=gateway_renderer,
                trace_store=gateway_trace_store,
                backend=sandbox_backend,
            )
        assert not hits, (
            f"the harness sent {len(hits)} requests to OPENAI_BASE_URL instead of the session's"
            f" endpoint: {hits[:5]}; send every model call to llm.base_url with llm.api_key"
        )
        assert played.requests, "the harness never called the model"
        others = sorted({r.session_id for r in played.requests} - {played.session_id})
        assert not others, f"model calls arrived for other sessions: {others}"
        assert gateway_trace_store.sessions() == [played.session_id], (
            f"the gateway recorded sessions {gateway_trace_store.sessions()}, expected only"
            f" {played.session_id!r}"
        )

    # ------------------------------------------------------------------ hostile agents

    @pytest.mark.parametrize("agent", sorted(HOSTILE_AGENTS))
    def test_a_hostile_agent_is_never_rewarded(
        self,
        agent: str,
        graded_task: GradedTask,
        agent_running: AgentRunning,
        graded_sandbox_backend: SandboxBackend,
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
    ) -> None:
        what = f"the agent that {agent.replace('-', ' ')}"
        run = self.play_graded(
            graded_task,
            HOSTILE_AGENTS[agent],
            agent_running,
            renderer=gateway_renderer,
            trace_store=gateway_trace_store,
            backend=graded_sandbox_backend,
        )
        self._check_graded_script_used(run, what)
        for failure in run.batch.infra_failures:
            assert failure.termination in (Termination.VERIFIER_ERROR, Termination.SANDBOX_ERROR), (
                f"{what} ended with {failure.termination.value}: {failure.error}"
            )
        for episode in (e for group in run.batch.groups for e in group):
            assert episode.reward == 0.0, (
                f"{what} was graded {episode.reward} on task {graded_task.task.task_id!r}"
                f" (termination {episode.termination.value}); a hostile agent must score 0 (see"
                " HOSTILE_AGENTS)"
            )

    def test_an_agent_that_solves_the_graded_task_is_rewarded(
        self,
        graded_task: GradedTask,
        agent_running: AgentRunning,
        graded_sandbox_backend: SandboxBackend,
        gateway_renderer: Renderer,
        gateway_trace_store: TraceStore,
    ) -> None:
        what = "the agent that runs the task's solution"
        run = self.play_graded(
            graded_task,
            graded_task.solution,
            agent_running,
            renderer=gateway_renderer,
            trace_store=gateway_trace_store,
            backend=graded_sandbox_backend,
        )
        self._check_graded_script_used(run, what)
        failures = [f"{f.termination.value}: {f.error}" for f in run.batch.infra_failures]
        assert not failures, f"{what} was not graded: {failures}"
        (episode,) = run.batch.groups[0]
        assert episode.reward == 1.0, (
            f"{what} was graded {episode.reward} on task {graded_task.task.task_id!r}"
            f" (termination {episode.termination.value}, harness metadata"
            f" {episode.metadata.get('harness')!r}), expected 1"
        )

    def _check_graded_script_used(self, run: _GradedRun, what: str) -> None:
        if run.script_length >= 0:
            assert run.model_calls == run.script_length, (
                f"for {what} the harness made {run.model_calls} model calls, but the script"
                f" agent_running gave holds {run.script_length}: did the agent run its command?"
            )
