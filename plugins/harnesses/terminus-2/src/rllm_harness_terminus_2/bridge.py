"""The harness's side of the bridge: the driver process and the socket to it.

:class:`Driver` starts ``driver.py`` with the side interpreter (``python -I``, so that neither
this package's folder nor ``PYTHON*`` variables reach its ``sys.path``), in a session of its
own, with an environment stripped of model credentials and endpoints (the agent may only
reach the episode's session, whose URL and key travel over the socket), and accepts its
connection on a unix socket in a private temporary folder. The driver's output goes to a
log file whose tail explains a driver that died.

One driver per interpreter serves the whole process (:func:`shared`): importing harbor costs
seconds of CPU, so harnesses, event loops and episodes share it. The socket is read by a
thread of its own; each episode belongs to the event loop that opened it, and what the
driver sends for it is handed to that loop: a command (``exec``) runs there through
:meth:`rllm_core.ports.Sandbox.exec`, and the episode's end (``done``) resolves
:attr:`Episode.done`. A driver that exits fails every open episode with
:class:`DriverDied`. The messages are described in :mod:`rllm_harness_terminus_2.driver`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm_core.errors import SandboxCommandTimeout, SandboxError
from rllm_core.ports import Sandbox

__all__ = ["DRIVER", "Driver", "DriverDied", "Episode", "forget", "shared"]

DRIVER = Path(__file__).with_name("driver.py")
_TAIL_BYTES = 4000
_STRIPPED_PREFIXES = ("OPENAI_", "ANTHROPIC_", "LITELLM_", "AZURE_", "GEMINI_", "PYTHON")
_STRIPPED = frozenset({"VIRTUAL_ENV", "HF_TOKEN"})


class DriverDied(Exception):
    """The driver process exited or could not start; the message holds its output's tail."""


@dataclass
class Episode:
    """One episode the driver runs: the loop it belongs to, where its commands go and how
    it ended."""

    episode_id: str
    sandbox: Sandbox
    user: str | None
    env: Mapping[str, str]
    command_timeout_s: float
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[dict[str, Any]]
    execs: set[concurrent.futures.Future[None]] = field(default_factory=set)
    exec_count: int = 0
    exec_seconds: float = 0.0

    def resolve(self, message: dict[str, Any] | None, error: BaseException | None = None) -> None:
        """Resolve :attr:`done` from any thread (nothing when its loop has closed)."""

        def settle() -> None:
            if self.done.done():
                return
            if error is not None:
                self.done.set_exception(error)
            else:
                self.done.set_result(message or {})

        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(settle)


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
    """A running driver: :meth:`start` it (blocking: call it in a thread), end it with
    :meth:`stop` or :meth:`kill` (both safe from any thread, more than once)."""

    def __init__(self, python: Path, folder: Path, process: subprocess.Popen[bytes]) -> None:
        self.python = python
        self.folder = folder
        self.process = process
        self.episodes: dict[str, Episode] = {}
        self.harbor_version: str | None = None
        self._socket: socket.socket | None = None
        self._write_lock = threading.Lock()
        self._episodes_lock = threading.Lock()
        self._dead: str | None = None
        self._reader: threading.Thread | None = None

    @classmethod
    def start(cls, python: Path, *, timeout_s: float) -> Driver:
        """Start the driver with ``python`` and wait until it has imported harbor and
        connected (``timeout_s`` at most); raises :class:`DriverDied` otherwise."""
        folder = Path(tempfile.mkdtemp(prefix="rllm-terminus-2-"))
        socket_path = folder / "driver.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(socket_path))
        listener.listen(1)
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
            listener.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise DriverDied(f"could not start {python}: {exc}") from exc
        finally:
            log.close()
        driver = cls(python, folder, process)
        try:
            driver._connect(listener, timeout_s)
        except BaseException:
            driver.kill()
            raise
        finally:
            listener.close()
        return driver

    def _connect(self, listener: socket.socket, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        listener.settimeout(0.1)
        while self._socket is None:
            if self.process.poll() is not None:
                raise DriverDied(self._death("exited before connecting"))
            if time.monotonic() > deadline:
                raise DriverDied(self._death(f"did not connect within {timeout_s:g} s"))
            with contextlib.suppress(TimeoutError):
                self._socket, _ = listener.accept()
        self._socket.settimeout(max(0.1, deadline - time.monotonic()))
        stream = self._socket.makefile("rb")
        try:
            line = stream.readline()
        except TimeoutError:
            raise DriverDied(self._death(f"was not ready within {timeout_s:g} s")) from None
        if not line:
            raise DriverDied(self._death("closed the socket before it was ready"))
        self.harbor_version = json.loads(line).get("harbor")
        self._socket.settimeout(None)
        self._reader = threading.Thread(
            target=self._read, args=(stream,), name="terminus-2-driver", daemon=True
        )
        self._reader.start()

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

    def _read(self, stream: Any) -> None:
        """The reader thread: hand each message to its episode's loop until the driver
        closes the socket, then fail the episodes still open."""
        try:
            for line in stream:
                message = json.loads(line)
                episode = self.episodes.get(message.get("episode", ""))
                op = message.get("op")
                if op == "exec":
                    self._exec(episode, message)
                elif op in ("done", "probe_result") and episode is not None:
                    episode.resolve(message)
        except (OSError, ValueError) as exc:
            self._dead = f"broke the connection ({type(exc).__name__}: {exc})"
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=1.0)  # so that the exit code is known
        if self._dead is None:
            self._dead = "exited"
        error = DriverDied(self._death(self._dead))
        with self._episodes_lock:
            open_episodes = list(self.episodes.values())
        for episode in open_episodes:
            episode.resolve(None, error)

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\n"
        with self._write_lock:
            if self._socket is None or self._dead is not None:
                raise DriverDied(self._death(self._dead or "closed its connection"))
            try:
                self._socket.sendall(data)
            except OSError as exc:
                raise DriverDied(self._death(f"could not be written to ({exc})")) from exc

    def open(self, episode: Episode, start: dict[str, Any]) -> None:
        """Register ``episode`` and ask the driver to start it with ``start``."""
        with self._episodes_lock:
            self.episodes[episode.episode_id] = episode
        self._send({"op": "start", "episode": episode.episode_id, **start})

    def probe(self, episode: Episode, command: str, count: int) -> None:
        """Register ``episode`` and ask the driver to time ``count`` round trips of
        ``command`` through it; :attr:`Episode.done` receives the ``probe_result``."""
        with self._episodes_lock:
            self.episodes[episode.episode_id] = episode
        self._send(
            {"op": "probe", "episode": episode.episode_id, "command": command, "count": count}
        )

    def cancel(self, episode_id: str) -> None:
        with contextlib.suppress(DriverDied):
            self._send({"op": "cancel", "episode": episode_id})

    async def close_episode(self, episode_id: str) -> None:
        """Forget the episode and cancel the commands it still has in flight (their
        sandbox processes end with them); called on the episode's loop."""
        with self._episodes_lock:
            episode = self.episodes.pop(episode_id, None)
        if episode is None:
            return
        pending = [future for future in list(episode.execs) if not future.done()]
        for future in pending:
            future.cancel()
        if pending:
            await asyncio.wait([asyncio.wrap_future(f) for f in pending], timeout=5.0)

    def _exec(self, episode: Episode | None, message: dict[str, Any]) -> None:
        if episode is None:
            self._answer(message["id"], {"sandbox_error": "the episode has ended"})
            return
        try:
            future = asyncio.run_coroutine_threadsafe(
                self._run_exec(episode, message), episode.loop
            )
        except RuntimeError:  # the episode's loop has closed
            self._answer(message["id"], {"sandbox_error": "the episode has ended"})
            return
        episode.execs.add(future)
        future.add_done_callback(episode.execs.discard)

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
        with contextlib.suppress(DriverDied):
            self._send({"op": "exec_result", "id": call_id, **answer})

    def stop(self, grace_s: float = 2.0) -> None:
        """Close the socket (the driver exits on its own), then end the process group."""
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        self.kill()

    def kill(self) -> None:
        """End the driver's process group now and remove its folder."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5.0)
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_DRIVERS: dict[Path, Driver] = {}
_DRIVERS_LOCK = threading.Lock()


def shared(python: Path, *, timeout_s: float) -> Driver:
    """The process's driver for ``python``, started when there is none or it died
    (blocking: call it in a thread)."""
    with _DRIVERS_LOCK:
        driver = _DRIVERS.get(python)
        if driver is not None and driver.alive:
            return driver
        if driver is not None:
            driver.kill()
        driver = _DRIVERS[python] = Driver.start(python, timeout_s=timeout_s)
        return driver


def forget(driver: Driver) -> bool:
    """Stop ``driver`` when it runs no episode (it is started again on demand); whether it
    was stopped."""
    with _DRIVERS_LOCK:
        if driver.episodes:
            return False
        if _DRIVERS.get(driver.python) is driver:
            del _DRIVERS[driver.python]
    driver.stop(grace_s=0.5)
    return True


@atexit.register
def _kill_all() -> None:
    with _DRIVERS_LOCK:
        drivers = list(_DRIVERS.values())
        _DRIVERS.clear()
    for driver in drivers:
        driver.kill()
