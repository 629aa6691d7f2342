"""The Terminus-2 driver: harbor's ``Terminus2`` agent, run for the ``terminus-2`` harness.

This file runs under the side interpreter (Python 3.12 or newer, with the pinned ``harbor``),
started as ``python driver.py SOCKET``. It imports only the standard library and harbor, never
rllm-core, which lives in the harness's interpreter. One driver runs many episodes at once
on its event loop; it talks to the harness over the unix socket ``SOCKET`` in JSON lines:

harness to driver:
    ``{"op": "start", "episode": E, ...}`` (:class:`Start`), ``{"op": "cancel", "episode":
    E}``, ``{"op": "exec_result", "id": N, ...}`` (the answer to an ``exec``), ``{"op":
    "probe", "episode": E, "command": C, "count": N}`` (time N round trips of ``C`` through
    the environment object, no agent: what the bridge costs per command).
driver to harness:
    ``{"op": "ready", "harbor": VERSION}`` once, after importing harbor; ``{"op": "exec",
    "episode": E, "id": N, "command": ..., "cwd": ..., "env": ..., "timeout": ...}`` for every
    command the agent runs in its environment; ``{"op": "done", "episode": E, "termination":
    ..., "turns": ..., "metadata": {...}}`` once per episode (``"termination": "cancelled"``
    after a cancel); ``{"op": "probe_result", "episode": E, "seconds": [...]}``.

The agent is harbor's own class, unchanged in what it prompts and parses. The driver holds
it to the episode through its instance: the model client's ``call`` is wrapped to count
model calls (a cap, as the agent re-prompts a reply cut at ``max_tokens`` without counting a
turn), send the session key with each request (never in the agent's kwargs, which its
trajectory file records), retry only what the harness allows and end the episode on an error
the agent would otherwise retry for minutes; its reply handling is wrapped to count parse
errors in a row, and its summarization to note the model call it began after. An episode
ends by raising :class:`EpisodeEnd`, a ``BaseException``, so that neither the agent's
``except Exception`` fallbacks nor its retry decorators catch it.
The driver exits when the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from harbor.agents.terminus_2.terminus_2 import Terminus2
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.llms.base import (
    ContextLengthExceededError,
    OutputLengthExceededError,
)
from harbor.llms.lite_llm import LiteLLM
from harbor.models.agent.context import AgentContext

STREAM_LIMIT = 64 * 1024 * 1024
"""Longest JSON line either side reads (a command's output travels in one)."""

_CONTEXT_MARKERS = ("prompt_too_long", "upstream_rejected", "context_length_exceeded")
"""Error codes that say the prompt does not fit: the gateway's own (its limit, and a model
server's refusal it passes on) and OpenAI's."""

_RETRY_BASE_S = 0.5


class EpisodeEnd(BaseException):
    """Ends the episode with ``termination`` and ``details`` for the outcome's metadata."""

    def __init__(self, termination: str, **details: Any) -> None:
        super().__init__(termination)
        self.termination = termination
        self.details = details


@dataclass(frozen=True)
class Start:
    """What the harness sends to start an episode."""

    episode: str
    instruction: str
    base_url: str
    api_key: str
    model: str
    budget_s: float
    agent: dict[str, Any]
    max_model_calls: int
    max_consecutive_format_errors: int
    max_retries: int
    request_timeout_s: float
    max_tokens: int | None = None
    context_window: int | None = None

    @classmethod
    def of(cls, message: dict[str, Any]) -> Start:
        return cls(**{k: v for k, v in message.items() if k != "op"})


class Channel:
    """The socket to the harness: writes are serialised, ``exec`` answers matched by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.next_id = 0

    def send(self, message: dict[str, Any]) -> None:
        self.writer.write(json.dumps(message).encode() + b"\n")

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        call_id = self.next_id
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = future
        try:
            self.send({**message, "id": call_id})
            await self.writer.drain()
            return await future
        finally:
            self.pending.pop(call_id, None)


class BridgeEnvironment(BaseEnvironment):
    """harbor's environment interface over the harness's sandbox.

    ``exec`` travels to the harness, which runs it through the episode's sandbox as the
    task's agent user (whatever ``user`` the agent asks for: it probes tmux as root), in
    the task's workdir unless ``cwd`` is given, with the episode's ``TMUX_TMPDIR``. The
    file transfers are only used to record terminal sessions, which the driver turns off.
    BaseEnvironment's constructor wants a harbor trial (paths, task config); the agent
    reads none of it, so it is not called.
    """

    def __init__(self, channel: Channel, episode: str) -> None:
        self.channel = channel
        self.episode = episode
        self.session_id = episode
        self.default_user = None
        self.commands = 0

    @staticmethod
    def type() -> str:
        return "rllm-sandbox"

    def _validate_definition(self) -> None:
        pass

    async def start(self, force_build: bool) -> None:
        pass

    async def stop(self, delete: bool) -> None:
        pass

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        raise NotImplementedError("file transfers are off: record_terminal_session is False")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        raise NotImplementedError("file transfers are off: record_terminal_session is False")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        raise NotImplementedError("file transfers are off: record_terminal_session is False")

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        raise NotImplementedError("file transfers are off: record_terminal_session is False")

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        self.commands += 1
        answer = await self.channel.request(
            {
                "op": "exec",
                "episode": self.episode,
                "command": command,
                "cwd": cwd,
                "env": env,
                "timeout": timeout_sec,
            }
        )
        if answer.get("sandbox_error"):
            raise EpisodeEnd(
                "sandbox_error",
                error=answer["sandbox_error"],
                error_type=answer.get("error_type", "SandboxError"),
            )
        return ExecResult(
            stdout=answer.get("stdout", ""),
            stderr=answer.get("stderr", ""),
            return_code=int(answer.get("return_code", 1)),
        )


@dataclass
class Counters:
    """What the wrappers count over one episode."""

    requests: int = 0
    answered: int = 0
    format_errors: int = 0
    consecutive_format_errors: int = 0
    cut_replies: int = 0
    confirmed: bool = False
    retries: int = 0
    summarizations: list[int] = field(default_factory=list)


def _is_context_error(exc: BaseException) -> bool:
    if isinstance(exc, (ContextLengthExceededError, litellm.ContextWindowExceededError)):
        return True
    text = " ".join(str(part) for part in (exc, getattr(exc, "body", ""), exc.__cause__ or ""))
    return any(marker in text for marker in _CONTEXT_MARKERS)


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, (litellm.APIConnectionError, litellm.Timeout)):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status == 429 or status >= 500)


def _model_error(exc: BaseException) -> EpisodeEnd:
    if isinstance(exc, litellm.Timeout):
        error_type = "APITimeoutError"
    elif isinstance(exc, litellm.APIConnectionError):
        error_type = "APIConnectionError"
    else:
        error_type = type(exc).__name__
    details: dict[str, Any] = {"error": str(exc)[:2000], "error_type": error_type}
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(exc, litellm.APIConnectionError):
        details["status"] = status
    return EpisodeEnd("model_error", **details)


def hold(agent: Terminus2, start: Start, counters: Counters) -> None:
    """Wrap the agent's model client and reply handling for the episode (see the module
    docstring)."""
    llm = agent._llm
    # The client's own retry decorator waits 4 to 15 s between three attempts, and the
    # agent's wraps it in three more: the driver retries instead, as the harness allows.
    unretried = LiteLLM.call.__wrapped__
    request_kwargs: dict[str, Any] = {
        "api_key": start.api_key,
        "timeout": start.request_timeout_s,
        "max_retries": 0,
    }

    async def call(prompt: str, message_history: Any = (), **kwargs: Any) -> Any:
        if counters.requests >= start.max_model_calls:
            raise EpisodeEnd("max_turns", limit="model_calls")
        counters.requests += 1
        attempt = 0
        while True:
            try:
                response = await unretried(
                    llm, prompt, list(message_history), **kwargs, **request_kwargs
                )
            except OutputLengthExceededError:
                counters.answered += 1
                counters.cut_replies += 1
                raise
            except ContextLengthExceededError as exc:
                raise EpisodeEnd("context_length", error=str(exc) or "context length") from exc
            except Exception as exc:
                if _is_context_error(exc):
                    raise EpisodeEnd(
                        "context_length", error=str(exc)[:2000], error_type=type(exc).__name__
                    ) from exc
                if attempt < start.max_retries and _retryable(exc):
                    attempt += 1
                    counters.retries += 1
                    await asyncio.sleep(_RETRY_BASE_S * 2 ** (attempt - 1))
                    continue
                raise _model_error(exc) from exc
            counters.answered += 1
            return response

    llm.call = call
    handle = agent._handle_llm_interaction

    async def handle_reply(chat: Any, prompt: str, *args: Any, **kwargs: Any) -> Any:
        pending = agent._pending_completion
        result = await handle(chat, prompt, *args, **kwargs)
        feedback = result[2]
        if feedback and "ERROR:" in feedback:
            counters.format_errors += 1
            counters.consecutive_format_errors += 1
            limit = start.max_consecutive_format_errors
            if limit and counters.consecutive_format_errors >= limit:
                raise EpisodeEnd("format_error", format_errors=counters.format_errors)
        else:
            counters.consecutive_format_errors = 0
            counters.confirmed = bool(result[1]) and pending
        return result

    agent._handle_llm_interaction = handle_reply
    summarize = agent._summarize

    async def summarize_counted(*args: Any, **kwargs: Any) -> Any:
        counters.summarizations.append(counters.answered)
        return await summarize(*args, **kwargs)

    agent._summarize = summarize_counted


def build_agent(start: Start, logs_dir: Path) -> Terminus2:
    options = dict(start.agent)
    llm_call_kwargs: dict[str, Any] = {}
    if start.max_tokens is not None:
        llm_call_kwargs["max_tokens"] = start.max_tokens
    model_info = None
    if start.context_window is not None:
        model_info = {
            "max_input_tokens": start.context_window,
            "max_tokens": start.context_window,
            "max_output_tokens": start.max_tokens,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    return Terminus2(
        logs_dir=logs_dir,
        model_name=f"openai/{start.model}",
        api_base=start.base_url,
        model_info=model_info,
        llm_call_kwargs=llm_call_kwargs,
        record_terminal_session=False,
        suppress_max_turns_warning=True,
        session_id=start.episode,
        **options,
    )


def _commands(agent: Terminus2) -> list[str]:
    """The keystrokes the agent sent, in order, from its trajectory steps."""
    sent: list[str] = []
    for step in agent._trajectory_steps:
        for call in step.tool_calls or ():
            if call.function_name == "bash_command":
                sent.append(str(call.arguments.get("keystrokes", "")))
    return sent


async def run_episode(channel: Channel, start: Start) -> dict[str, Any]:
    """One episode, start to end: the ``done`` message's fields."""
    counters = Counters()
    began = time.monotonic()
    logs_dir = Path(tempfile.mkdtemp(prefix="rllm-terminus-2-"))
    environment = BridgeEnvironment(channel, start.episode)
    agent: Terminus2 | None = None
    termination = "done"
    details: dict[str, Any] = {}
    try:
        async with asyncio.timeout(start.budget_s):
            agent = build_agent(start, logs_dir)
            hold(agent, start, counters)
            try:
                await agent.setup(environment)
            except (RuntimeError, TimeoutError) as exc:
                raise EpisodeEnd(
                    "sandbox_error",
                    error=f"the agent's tmux session did not start: {exc}"[:2000],
                    error_type="TmuxStartError",
                ) from exc
            await agent.run(start.instruction, environment, AgentContext())
        if counters.confirmed:
            termination = "done"
        elif agent._n_episodes >= agent._max_episodes:
            termination = "max_turns"
            details["limit"] = "turns"
        else:
            termination = "done"
            details["exit"] = "terminal_closed"
    except EpisodeEnd as end:
        termination = end.termination
        details.update(end.details)
    except TimeoutError:
        termination = "timeout"
    finally:
        shutil.rmtree(logs_dir, ignore_errors=True)
    turns = counters.answered
    metadata = {
        **details,
        "model_calls": counters.requests,
        "format_errors": counters.format_errors,
        "cut_replies": counters.cut_replies,
        "retries": counters.retries,
        "agent_turns": agent._n_episodes if agent is not None else 0,
        "summarizations": agent._summarization_count if agent is not None else 0,
        "summarized_at_call": counters.summarizations,
        "environment_commands": environment.commands,
        "commands": _commands(agent) if agent is not None else [],
        "driver_elapsed_s": round(time.monotonic() - began, 3),
    }
    return {"termination": termination, "turns": turns, "metadata": metadata}


async def probe(channel: Channel, message: dict[str, Any]) -> None:
    """Time ``count`` round trips of ``command`` through a :class:`BridgeEnvironment`."""
    environment = BridgeEnvironment(channel, message["episode"])
    seconds = []
    for _ in range(int(message["count"])):
        began = time.perf_counter()
        await environment.exec(message["command"])
        seconds.append(time.perf_counter() - began)
    channel.send({"op": "probe_result", "episode": message["episode"], "seconds": seconds})
    await channel.writer.drain()


async def serve(socket_path: str) -> None:
    from importlib.metadata import version

    reader, writer = await asyncio.open_unix_connection(socket_path, limit=STREAM_LIMIT)
    channel = Channel(reader, writer)
    episodes: dict[str, asyncio.Task[None]] = {}

    async def play(start: Start) -> None:
        try:
            done = await run_episode(channel, start)
        except asyncio.CancelledError:
            done = {"termination": "cancelled", "turns": 0, "metadata": {}}
        except Exception as exc:
            done = {
                "termination": "driver_error",
                "turns": 0,
                "metadata": {
                    "error": f"{type(exc).__name__}: {exc}"[:2000],
                    "error_type": type(exc).__name__,
                    "traceback": traceback.format_exc()[-4000:],
                },
            }
        episodes.pop(start.episode, None)
        with contextlib.suppress(ConnectionError):
            channel.send({"op": "done", "episode": start.episode, **done})
            await writer.drain()

    channel.send({"op": "ready", "harbor": version("harbor"), "pid": os.getpid()})
    await writer.drain()

    def handle(message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "exec_result":
            future = channel.pending.get(message["id"])
            if future is not None and not future.done():
                future.set_result(message)
        elif op == "start":
            start = Start.of(message)
            episodes[start.episode] = asyncio.ensure_future(play(start))
        elif op == "probe":
            timing = asyncio.ensure_future(probe(channel, message))
            episodes[message["episode"]] = timing
            timing.add_done_callback(lambda _: episodes.pop(message["episode"], None))
        elif op == "cancel":
            task = episodes.get(message["episode"])
            if task is not None:
                task.cancel()
        else:
            raise ValueError(f"unknown op {op!r}")

    while line := await reader.readline():
        try:
            handle(json.loads(line))
        except Exception:
            # A message this driver cannot act on: say so in its log (the harness shows
            # the log's tail) and keep serving the other episodes.
            print(f"driver: could not handle {line[:200]!r}:", file=sys.stderr, flush=True)
            traceback.print_exc()
    for task in list(episodes.values()):
        task.cancel()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python driver.py SOCKET", file=sys.stderr)
        return 2
    asyncio.run(serve(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
