"""The vLLM servers ``[sampler.serve]`` starts: their command lines (:func:`serve_commands`, a
pure function), the check that this machine can run them (:func:`check_can_serve`), and the
processes (:class:`ServerProcesses`: started, waited for on ``GET /health``, stopped).

Every server runs ``vllm serve <model> --host H --port P --served-model-name NAME
--logprobs-mode processed_logprobs`` (logprobs after temperature, as the Sampler port wants).
For LoRA training it adds ``--enable-lora --max-lora-rank R --max-loras K`` and the environment
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (vLLM serves ``/v1/load_lora_adapter`` only then);
for full weights ``VLLM_SERVER_DEV_MODE=1`` (``/collective_rpc`` and ``/reset_prefix_cache``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rllm_core.errors import ComponentError, UpstreamUnavailableError
from rllm_core.gateway.httpclient import HttpClient, HttpConnectError, HttpProtocolError, Origin

if TYPE_CHECKING:
    from rllm_sampler_vllm.plugin import VllmServeSettings

__all__ = ["Launch", "ServerProcesses", "check_can_serve", "serve_commands"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launch:
    """One server: its ``argv``, the environment variables it adds, and its base URL."""

    argv: list[str]
    env: dict[str, str]
    url: str
    port: int


def serve_commands(
    serve: VllmServeSettings, *, served_model_name: str | None, api_key: str | None = None
) -> list[Launch]:
    """The command line and environment of every server ``serve`` describes."""
    name = served_model_name or serve.model
    host = serve.host
    url_host = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        url_host = "127.0.0.1"
    launches = []
    for index, port in enumerate(serve.ports):
        argv = [serve.executable, "serve", serve.model, "--host", host, "--port", str(port)]
        argv += ["--served-model-name", name, "--logprobs-mode", "processed_logprobs"]
        env: dict[str, str] = {}
        if serve.max_lora_rank:
            argv += ["--enable-lora", "--max-lora-rank", str(serve.max_lora_rank)]
            argv += ["--max-loras", str(serve.max_loras)]
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        else:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if api_key:
            argv += ["--api-key", api_key]
        argv += list(serve.extra_args)
        if serve.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = serve.gpus[index]
        launches.append(Launch(argv=argv, env=env, url=f"http://{url_host}:{port}", port=port))
    return launches


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def check_can_serve(
    *,
    find_spec: Callable[[str], object] = importlib.util.find_spec,
    cuda_devices: Callable[[], int] = _cuda_devices,
) -> None:
    """Raise :class:`~rllm_core.errors.ComponentError` naming ``[sampler] serve`` when vLLM is
    not installed here or no CUDA device is visible."""
    if find_spec("vllm") is None:
        raise ComponentError(
            "[sampler] serve starts vLLM servers, but vLLM is not installed here (import vllm"
            " fails): install it (pip install vllm) on a machine with a GPU, or start vLLM"
            " yourself and give [sampler] urls instead of serve",
            kind="sampler",
            name="vllm",
        )
    if cuda_devices() < 1:
        raise ComponentError(
            "[sampler] serve starts vLLM servers, but no CUDA GPU is visible here"
            " (torch.cuda.device_count() is 0): run on a machine with a GPU, or give [sampler]"
            " urls of vLLM servers running elsewhere instead of serve",
            kind="sampler",
            name="vllm",
        )


@dataclass
class ServerProcesses:
    """The servers of ``launches``, started by :meth:`start` and stopped by :meth:`stop`.

    ``log_dir``: each server writes to ``<log_dir>/vllm-<port>.log`` (``None``: to this
    process's output)."""

    launches: Sequence[Launch]
    log_dir: str | None = None
    startup_timeout_s: float = 1200.0
    poll_s: float = 1.0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    async def start(self) -> None:
        """Start every server and wait until each answers ``GET /health`` with 200; a server
        that exits or stays silent past ``startup_timeout_s`` stops them all and raises."""
        if self.log_dir is not None:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        for launch in self.launches:
            output: IO[bytes] | None = None
            if self.log_dir is not None:
                output = open(Path(self.log_dir) / f"vllm-{launch.port}.log", "ab")  # noqa: SIM115
                self._logs.append(output)
            log.info("starting %s", " ".join(launch.argv))
            self.processes.append(
                subprocess.Popen(
                    launch.argv,
                    env={**os.environ, **launch.env},
                    stdout=output,
                    stderr=subprocess.STDOUT if output is not None else None,
                    start_new_session=True,
                )
            )
        try:
            pairs = zip(self.launches, self.processes, strict=True)
            await asyncio.gather(*(self._wait(launch, process) for launch, process in pairs))
        except BaseException:
            self.stop()
            raise

    async def _wait(self, launch: Launch, process: subprocess.Popen[bytes]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout_s
        client = HttpClient(connect_timeout_s=5.0)
        where = f"; its output is in {self.log_dir}/vllm-{launch.port}.log" if self.log_dir else ""
        try:
            while True:
                code = process.poll()
                if code is not None:
                    raise UpstreamUnavailableError(
                        f"vLLM server {launch.url} exited with status {code} while starting"
                        f" ({' '.join(launch.argv)}){where}"
                    )
                with contextlib.suppress(HttpConnectError, HttpProtocolError, TimeoutError):
                    response = await client.request(
                        "GET", Origin.parse(launch.url), "/health", timeout_s=5.0
                    )
                    if response.status == 200:
                        log.info("vLLM server %s is up", launch.url)
                        return
                if loop.time() > deadline:
                    raise UpstreamUnavailableError(
                        f"vLLM server {launch.url} did not answer GET /health within"
                        f" {self.startup_timeout_s:.0f}s ([sampler.serve] startup_timeout_s){where}"
                    )
                await asyncio.sleep(self.poll_s)
        finally:
            await client.aclose()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every server (SIGTERM, then SIGKILL after ``timeout_s``). Idempotent."""
        processes, self.processes = self.processes, []
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        logs, self._logs = self._logs, []
        for output in logs:
            output.close()
