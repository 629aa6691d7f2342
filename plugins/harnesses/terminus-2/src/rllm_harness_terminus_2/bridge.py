"""The harness's side of the bridge: the driver process and the socket to it.

:class:`Driver` starts ``driver.py`` with the side interpreter (``python -I``, so that neither
this package's folder nor ``PYTHON*`` variables reach its ``sys.path``), in a session of its
own, with an environment stripped of model credentials and endpoints (the agent may only
reach the episode's session, whose URL and key travel over the socket), and listens on a
unix socket in a private temporary folder. The driver's output goes to a log file whose tail
explains a driver that died.

Each episode registers a :class:`Episode`: the sandbox and identity its commands run with.
A command the driver forwards (``exec``) runs through :meth:`rllm_core.ports.Sandbox.exec`
as a task of its own; the episode's end (``done``) resolves :attr:`Episode.done`. A driver
that exits fails every open episode with :class:`DriverDied`. The messages are described in
:mod:`rllm_harness_terminus_2.driver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm_core.errors import SandboxCommandTimeout, SandboxError
from rllm_core.ports import Sandbox

__all__ = ["DRIVER", "Driver", "DriverDied", "Episode"]

DRIVER = Path(__file__).with_name("driver.py")
STREAM_LIMIT = 64 * 1024 * 1024
_TAIL_BYTES = 4000
_STRIPPED_PREFIXES = ("OPENAI_", "ANTHROPIC_", "LITELLM_", "AZURE_", "GEMINI_", "PYTHON")
_STRIPPED = frozenset({"VIRTUAL_ENV", "HF_TOKEN"})


class DriverDied(Exception):
    """The driver process exited or could not start; the message holds its output's tail."""


@dataclass
class Episode:
    """One episode the driver runs: where its commands go and how it ended."""

    episode_id: str
    sandbox: Sandbox
    user: str | None
    env: Mapping[str, str]
    command_timeout_s: float
    done: asyncio.Future[dict[str, Any]]
    execs: set[asyncio.Task[None]] = field(default_factory=set)
    exec_count: int = 0
    exec_seconds: float = 0.0


def _driver_env() -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _STRIPPED and not name.startswith(_STRIPPED_PREFIXES)
    }
    # litellm would fetch its price list from the network at import.
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return env


class Driver:
    """A running driver: start with :meth:`start`, end with :meth:`stop` (or
    :meth:`kill`, which works from any thread or event loop)."""

    def __init__(self, python: Path, folder: Path, process: subprocess.Popen[bytes]) -> None:
        self.python = python
        self.folder = folder
        self.process = process
        self.loop = asyncio.get_running_loop()
        self.episodes: dict[str, Episode] = {}
        self.harbor_version: str | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._server: asyncio.AbstractServer | None = None
        self._connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            self.loop.create_future()
        )
        self._dead: str | None = None

    @classmethod
    async def start(cls, python: Path, *, timeout_s: float) -> Driver:
        """Start the driver with ``python`` and wait until it has imported harbor and
        connected (``timeout_s`` at most); raises :class:`DriverDied` otherwise."""
        folder = Path(tempfile.mkdtemp(prefix="rllm-terminus-2-"))
        socket_path = folder / "driver.sock"
        log = open(folder / "driver.log", "wb")  # noqa: SIM115 - the process owns it
        try:
            process = subprocess.Popen(
                [str(python), "-I", str(DRIVER), str(socket_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_driver_env(),
                cwd=folder,
                start_new_session=True,
            )
        except OSError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise DriverDied(f"could not start {python}: {exc}") from exc
        finally:
            log.close()
        driver = cls(python, folder, process)
        try:
            driver._server = await asyncio.start_unix_server(
                driver._accept, path=str(socket_path), limit=STREAM_LIMIT
            )
            await driver._wait_ready(timeout_s)
        except BaseException:
            driver.kill()
            raise
        return driver

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connected.done():
            writer.close()
            return
        self._connected.set_result((reader, writer))

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._connected.done():
            if self.process.poll() is not None:
                raise DriverDied(self._death("exited before connecting"))
            if time.monotonic() > deadline:
                raise DriverDied(self._death(f"did not connect within {timeout_s:g} s"))
            await asyncio.sleep(0.05)
        reader, writer = self._connected.result()
        self._writer = writer
        remaining = max(0.1, deadline - time.monotonic())
        try:
            line = await asyncio.wait_for(reader.readline(), remaining)
        except TimeoutError:
            raise DriverDied(self._death(f"was not ready within {timeout_s:g} s")) from None
        if not line:
            raise DriverDied(self._death("closed the socket before it was ready"))
        ready = json.loads(line)
        self.harbor_version = ready.get("harbor")
        self._reader_task = asyncio.ensure_future(self._read(reader))

    def _death(self, what: str) -> str:
        code = self.process.poll()
        status = f" (exit code {code})" if code is not None else ""
        try:
            with open(self.folder / "driver.log", "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - _TAIL_BYTES))
                tail = log.read().decode(errors="replace").strip()
        except OSError:
            tail = ""
        output = f"; its output ends with:\n{tail}" if tail else "; it printed nothing"
        return f"the Terminus-2 driver ({self.python}) {what}{status}{output}"

    @property
    def alive(self) -> bool:
        return self._dead is None and self.process.poll() is None

    def usable_here(self) -> bool:
        """Whether this driver can serve episodes of the running event loop."""
        return self.alive and asyncio.get_running_loop() is self.loop

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                message = json.loads(line)
                op = message.get("op")
                if op == "exec":
                    self._exec(message)
                elif op in ("done", "probe_result"):
                    episode = self.episodes.get(message["episode"])
                    if episode is not None and not episode.done.done():
                        episode.done.set_result(message)
        except (ConnectionError, ValueError) as exc:
            self._dead = f"broke the connection ({type(exc).__name__}: {exc})"
        finally:
            if self._dead is None:
                await asyncio.sleep(0.1)  # let the exit code arrive
                self._dead = "exited"
            error = DriverDied(self._death(self._dead))
            for episode in self.episodes.values():
                if not episode.done.done():
                    episode.done.set_exception(error)

    def _send(self, message: dict[str, Any]) -> None:
        if self._writer is None or self._writer.is_closing():
            raise DriverDied(self._death(self._dead or "closed its connection"))
        self._writer.write(json.dumps(message).encode() + b"\n")

    def open(self, episode: Episode, start: dict[str, Any]) -> None:
        """Register ``episode`` and ask the driver to start it with ``start``."""
        self.episodes[episode.episode_id] = episode
        self._send({"op": "start", "episode": episode.episode_id, **start})

    def probe(self, episode: Episode, command: str, count: int) -> None:
        """Register ``episode`` and ask the driver to time ``count`` round trips of
        ``command`` through it; :attr:`Episode.done` receives the ``probe_result``."""
        self.episodes[episode.episode_id] = episode
        self._send(
            {"op": "probe", "episode": episode.episode_id, "command": command, "count": count}
        )

    def cancel(self, episode_id: str) -> None:
        with contextlib.suppress(DriverDied):
            self._send({"op": "cancel", "episode": episode_id})

    async def close_episode(self, episode_id: str) -> None:
        """Forget the episode and cancel the commands it still has in flight (their
        sandbox processes end with them)."""
        episode = self.episodes.pop(episode_id, None)
        if episode is None:
            return
        for task in episode.execs:
            task.cancel()
        if episode.execs:
            await asyncio.wait(episode.execs, timeout=5.0)

    def _exec(self, message: dict[str, Any]) -> None:
        episode = self.episodes.get(message.get("episode", ""))
        if episode is None:
            self._answer(message["id"], {"sandbox_error": "the episode has ended"})
            return
        task = asyncio.ensure_future(self._run_exec(episode, message))
        episode.execs.add(task)
        task.add_done_callback(episode.execs.discard)

    async def _run_exec(self, episode: Episode, message: dict[str, Any]) -> None:
        env = {**episode.env, **(message.get("env") or {})}
        timeout = float(message.get("timeout") or episode.command_timeout_s)
        began = time.monotonic()
        try:
            result = await episode.sandbox.exec(
                message["command"],
                timeout=timeout,
                user=episode.user,
                env=env,
                cwd=message.get("cwd") or None,
            )
        except SandboxCommandTimeout as exc:
            answer: dict[str, Any] = {
                "stdout": "",
                "stderr": f"timed out after {timeout:g} s: {exc}",
                "return_code": 124,
            }
        except SandboxError as exc:
            answer = {"sandbox_error": str(exc), "error_type": type(exc).__name__}
        else:
            answer = {
                "stdout": result.stdout,
                "stderr": result.stderr,
                "return_code": result.exit_code,
            }
        finally:
            episode.exec_count += 1
            episode.exec_seconds += time.monotonic() - began
        self._answer(message["id"], answer)

    def _answer(self, call_id: int, answer: dict[str, Any]) -> None:
        with contextlib.suppress(DriverDied, ConnectionError):
            self._send({"op": "exec_result", "id": call_id, **answer})

    async def stop(self, grace_s: float = 2.0) -> None:
        """Close the socket (the driver exits on its own), then end the process group."""
        if self._writer is not None:
            self._writer.close()
        deadline = time.monotonic() + grace_s
        while self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.kill()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reader_task

    def kill(self) -> None:
        """End the driver's process group now and remove its folder; safe to call from
        anywhere, more than once."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(RuntimeError):
                self._server.close()
        shutil.rmtree(self.folder, ignore_errors=True)
