"""A stand-in for a vLLM OpenAI server that keeps the state a sampler following a trainer
changes: runtime LoRA adapters, full-weight reloads, the prefix cache, restarts.

It is a :class:`~rllm_core.testing.fakeworker.FakeWorker` (same completions, same faults, same
``reply`` hook) that also answers, with vLLM's paths, bodies and statuses:

- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` and ``POST
  /v1/unload_lora_adapter`` ``{"lora_name"}`` (only with ``runtime_lora``, as vLLM serves them
  only under ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): a name already loaded is a 400 unless
  ``load_inplace``, an unknown one on unload a 404, a folder that does not exist a 404, an
  adapter whose ``adapter_config.json`` has ``r`` above ``max_lora_rank`` a 400;
- ``GET /v1/models``: the served model name and every loaded adapter (``root`` its folder);
- ``POST /collective_rpc`` (only with ``dev_mode``, as vLLM under ``VLLM_SERVER_DEV_MODE=1``):
  ``reload_weights`` with ``{"kwargs": {"weights_path": folder}}`` makes the base model serve
  that folder (without it, the folder it started with); a folder it cannot load is a 500 after
  which, as in vLLM, the engine is dead (completions 500, ``/health`` 503) until
  :meth:`FakeVllmServer.restart`; ``update_config`` is vLLM 0.32's 500 ("Field
  '_hf_config_revision' not found in ModelConfig"), ``reload_weights`` with ``args`` too, and
  any other method is vLLM's 500 "'Worker' object has no attribute ..." unless it is one of
  ``worker_methods`` (``legacy_reload=True`` accepts ``update_config`` then
  ``reload_weights``, as older vLLM did);
- ``POST /pause`` (completions wait until ``POST /resume``), ``GET /is_paused``, ``POST
  /update_weight_version`` ``{"new_version"}``, ``GET /weight_info`` (``"default"`` until set)
  and ``POST /reset_prefix_cache`` (``{"success": true}``), all under ``dev_mode``.

``tests/test_vllm_real_exchange.py`` plays one exchange against this fake and a real vLLM
server and holds their statuses and body shapes equal.

A completion's ``model`` is the served name (or absent) or a loaded adapter; anything else is
vLLM's 404 ``The model `X` does not exist.``. Each served completion is recorded in
:attr:`FakeVllmServer.completions` with the model it named and the weight version it ran on, read
from the folder name (``.../v7`` is version 7; a folder named otherwise is ``None``; the
weights the server started with are version 0).

Failure injection: :meth:`FakeVllmServer.fail_next_loads` and :meth:`fail_next_reloads` answer
the next adapter loads / weight reloads with an error status; :meth:`restart` forgets every
adapter and reloaded weight and is unreachable (connection refused) or answers 503 for a
while, then serves again on the same port.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from rllm_core.testing.fakeworker import FakeWorker, Reply, _respond, serve_forever

__all__ = ["FakeVllmServer", "Served", "version_of"]

_encode = msgspec.json.Encoder().encode
_VERSION = re.compile(r"v(\d+)$")


def version_of(path: str | None) -> int | None:
    """The weight version a folder named ``.../v<N>`` holds (``None`` for other names)."""
    if path is None:
        return 0
    match = _VERSION.search(Path(path).name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Served:
    """One completion the server admitted: the ``model`` it named (``None`` when it named
    none), the folder of the weights it ran on (``None``: the weights the server started with)
    and their version."""

    model: str | None
    path: str | None
    version: int | None


def _error(status: int, message: str, kind: str, param: str | None = None) -> tuple[int, bytes]:
    error = {"message": message, "type": kind, "param": param, "code": status}
    return status, _encode({"error": error})


def _worker_failed(method: str, message: str) -> tuple[int, bytes]:
    return _error(
        500,
        f"Call to {method} method failed: Worker failed with error '{message}', please check"
        " the stack trace above for the root cause",
        "InternalServerError",
    )


def _model_card(name: str, root: str, parent: str | None) -> dict[str, Any]:
    permission = {
        "id": f"modelperm-{name}",
        "object": "model_permission",
        "created": 0,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": 2048,
        "permission": [permission],
    }


class FakeVllmServer(FakeWorker):
    """A fake vLLM server; ``start()`` serves it in a background thread.

    ``model`` is the served model name (vLLM's ``--served-model-name``); ``runtime_lora``
    enables the adapter endpoints, ``dev_mode`` the reload and cache endpoints;
    ``max_lora_rank`` is the largest adapter rank it accepts. ``check_paths`` (default on)
    refuses adapter and weight folders that do not exist, as vLLM does. ``worker_methods``
    are what a ``--worker-extension-cls`` adds: ``/collective_rpc`` calls them by name with
    the request's ``args`` and ``kwargs`` and answers ``{"results": [<return value>]}``.
    """

    def __init__(
        self,
        *,
        model: str = "base",
        runtime_lora: bool = True,
        dev_mode: bool = True,
        max_lora_rank: int = 64,
        check_paths: bool = True,
        legacy_reload: bool = False,
        worker_methods: Mapping[str, Callable[..., Any]] | None = None,
        reply: Reply | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_s: float = 0.0,
    ) -> None:
        super().__init__(reply=reply, host=host, port=port, delay_s=delay_s)
        self.model = model
        self.runtime_lora = runtime_lora
        self.dev_mode = dev_mode
        self.max_lora_rank = max_lora_rank
        self.check_paths = check_paths
        self.legacy_reload = legacy_reload
        self.worker_methods = dict(worker_methods or {})
        self.adapters: dict[str, str] = {}
        self.paused = False
        self.pauses = 0
        self.engine_dead = False
        self.version_tag = "default"
        self.weights_path: str | None = None
        self.pending_model: str | None = None
        self.loads = 0
        self.unloads = 0
        self.reloads = 0
        self.prefix_cache_resets = 0
        self.restarts = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.completions: list[Served] = []
        self.prefix_cache_stale = False
        self.served_on_stale_cache = 0
        self._load_faults: deque[tuple[int, str]] = deque()
        self._reload_faults: deque[tuple[int, str]] = deque()
        self._unavailable_until = 0.0
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- control

    @property
    def weight_version(self) -> int | None:
        """The version the base model serves (0: the weights it started with)."""
        return version_of(self.weights_path)

    def fail_next_loads(
        self, count: int = 1, status: int = 500, message: str = "injected load failure"
    ) -> None:
        """Answer the next ``count`` ``/v1/load_lora_adapter`` calls with ``status``."""
        self._load_faults.extend([(status, message)] * count)

    def fail_next_reloads(
        self, count: int = 1, status: int = 500, message: str = "injected reload failure"
    ) -> None:
        """Answer the next ``count`` ``reload_weights`` calls with ``status``."""
        self._reload_faults.extend([(status, message)] * count)

    def restart(self, down_s: float = 0.3, *, refuse: bool = True) -> None:
        """Lose every adapter and reloaded weight, as a restarted vLLM does, and be down for
        ``down_s`` seconds: connections refused (``refuse``) or every call answered 503. Returns
        at once; the server comes back on the same port by itself."""
        with self._lock:
            self.adapters.clear()
            self.weights_path = None
            self.pending_model = None
            self.prefix_cache_stale = False
            self.paused = False
            self.engine_dead = False
            self.version_tag = "default"
            self.restarts += 1
        if not refuse:
            self._unavailable_until = time.monotonic() + down_s
            return
        self.server.stop()
        timer = threading.Timer(down_s, self.server.start)
        timer.daemon = True
        timer.start()

    def loaded(self) -> list[str]:
        """The names of the adapters loaded now, in load order."""
        return list(self.adapters)

    # ---------------------------------------------------------------- HTTP

    async def handle(self, method: str, path: str, raw: bytes, send: Callable) -> None:
        if time.monotonic() < self._unavailable_until:
            status, body = _error(503, "the server is starting", "ServiceUnavailableError")
            await _respond(send, status, body)
            return
        path = path.partition("?")[0]
        if self.engine_dead and path in ("/health", "/v1/completions"):
            status, body = _error(
                500 if path != "/health" else 503,
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
            )
            await _respond(send, status, body)
            return
        if path == "/v1/completions":
            while self.paused:
                await asyncio.sleep(0.01)
        route = self._routes().get((method, path))
        if route is None:
            await super().handle(method, path, raw, send)
            return
        try:
            payload = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            await _respond(send, *_error(400, f"JSON decode error: {exc}", "Bad Request"))
            return
        self.calls.append((path, payload))
        status, body = route(payload)
        await _respond(send, status, body)

    def _routes(self) -> dict[tuple[str, str], Callable[[dict[str, Any]], tuple[int, bytes]]]:
        routes: dict[tuple[str, str], Callable[[dict[str, Any]], tuple[int, bytes]]] = {
            ("GET", "/v1/models"): self._models,
        }
        if self.runtime_lora:
            routes[("POST", "/v1/load_lora_adapter")] = self._load
            routes[("POST", "/v1/unload_lora_adapter")] = self._unload
        if self.dev_mode:
            routes[("POST", "/collective_rpc")] = self._rpc
            routes[("POST", "/reset_prefix_cache")] = self._reset_cache
            routes[("POST", "/pause")] = self._pause
            routes[("POST", "/resume")] = self._resume
            routes[("GET", "/is_paused")] = lambda _: (200, _encode({"is_paused": self.paused}))
            routes[("POST", "/update_weight_version")] = self._set_version
            routes[("GET", "/weight_info")] = lambda _: (
                200,
                _encode({"weight_version": self.version_tag}),
            )
        return routes

    def _models(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        cards = [_model_card(self.model, self.weights_path or self.model, None)]
        cards += [_model_card(name, path, self.model) for name, path in self.adapters.items()]
        return 200, _encode({"object": "list", "data": cards})

    def _pause(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        self.paused = True
        self.pauses += 1
        return 200, _encode({"status": "paused"})

    def _resume(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        self.paused = False
        return 200, _encode({"status": "resumed"})

    def _set_version(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        version = payload.get("new_version")
        if not isinstance(version, str):
            return _error(400, "Field required: new_version", "Bad Request", "body.new_version")
        self.version_tag = version
        return 200, _encode({"success": True, "new_version": version})

    def _load(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        name, path = payload.get("lora_name"), payload.get("lora_path")
        for field, value in (("lora_name", name), ("lora_path", path)):
            if not value:
                return _error(400, f"Field required: {field}", "Bad Request", f"body.{field}")
        if self._load_faults:
            status, message = self._load_faults.popleft()
            return _error(status, message, "InternalServerError")
        if name in self.adapters and not payload.get("load_inplace"):
            return _error(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the"
                " adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        if self.check_paths:
            folder = Path(path)
            if not folder.is_dir():
                return _error(
                    404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError"
                )
            config = folder / "adapter_config.json"
            if config.is_file():
                rank = json.loads(config.read_text()).get("r", 0)
                if rank > self.max_lora_rank:
                    return _worker_failed(
                        "add_lora",
                        f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.",
                    )
        with self._lock:
            self.adapters[name] = path
            self.loads += 1
        return 200, f"Success: LoRA adapter '{name}' added successfully.".encode()

    def _unload(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        name = payload.get("lora_name")
        if not name:
            return _error(
                400,
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                "InvalidUserInput",
            )
        with self._lock:
            if name not in self.adapters:
                return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            del self.adapters[name]
            self.unloads += 1
        return 200, f"Success: LoRA adapter '{name}' removed successfully.".encode()

    def _rpc(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        method = payload.get("method")
        if method is None:
            return _error(400, "Missing 'method' in request body", "Bad Request")
        args = payload.get("args", [])
        kwargs = payload.get("kwargs", {})
        if method == "update_config":
            if not self.legacy_reload:
                return _worker_failed(
                    "collective_rpc", "Field '_hf_config_revision' not found in ModelConfig."
                )
            overrides = args[0] if args else kwargs.get("overrides", {})
            model = overrides.get("model_config", {}).get("model")
            if model is None or set(overrides) - {"model_config", "load_config"}:
                return _worker_failed("collective_rpc", f"unsupported overrides {overrides!r}")
            self.pending_model = model
            return 200, _encode({"results": [None]})
        if method == "reload_weights":
            if self._reload_faults:
                status, message = self._reload_faults.popleft()
                return _error(status, message, "InternalServerError")
            if "weights_path" in kwargs and self.legacy_reload:
                return _worker_failed(
                    "collective_rpc",
                    "reload_weights() got an unexpected keyword argument 'weights_path'",
                )
            path = kwargs.get("weights_path", self.pending_model)
            if path is not None and self.check_paths and not (Path(path) / "config.json").is_file():
                self.engine_dead = True
                return _worker_failed(
                    "collective_rpc",
                    f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'.",
                )
            with self._lock:
                self.weights_path = path
                self.reloads += 1
                self.prefix_cache_stale = True
            return 200, _encode({"results": [None]})
        extension = self.worker_methods.get(method)
        if extension is None:
            return _worker_failed("collective_rpc", f"'Worker' object has no attribute '{method}'")
        try:
            result = extension(*args, **kwargs)
        except Exception as exc:
            return _worker_failed("collective_rpc", str(exc))
        return 200, _encode({"results": [result]})

    def _reset_cache(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        self.prefix_cache_resets += 1
        self.prefix_cache_stale = False
        return 200, _encode({"success": True})

    def admit(self, body: Any) -> tuple[int, bytes] | None:
        model = body.model
        if model is None or model == self.model:
            path = self.weights_path
        elif model in self.adapters:
            path = self.adapters[model]
        else:
            return _error(
                404, f"The model `{model}` does not exist.", "NotFoundError", param="model"
            )
        if self.prefix_cache_stale and (model is None or model == self.model):
            self.served_on_stale_cache += 1
        self.completions.append(Served(model=model, path=path, version=version_of(path)))
        return None


def main(argv: list[str] | None = None) -> None:
    """``python -m rllm_core.testing.fakevllm serve MODEL --port P ...``: the fake in place of
    ``vllm serve``, reading the flags and environment a sampler starts vLLM with
    (``--served-model-name``, ``--enable-lora``, ``--max-lora-rank``,
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, ``VLLM_SERVER_DEV_MODE``); other flags are ignored."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description="A fake vLLM server.")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-lora-rank", type=int, default=16)
    args, _ = parser.parse_known_args(argv)
    lora_env = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("true", "1")
    server = FakeVllmServer(
        model=args.served_model_name or args.model,
        runtime_lora=args.enable_lora and lora_env,
        dev_mode=os.environ.get("VLLM_SERVER_DEV_MODE") == "1",
        max_lora_rank=args.max_lora_rank,
        host=args.host,
        port=args.port,
    )
    server.record = False
    serve_forever(server, announce=None)


if __name__ == "__main__":
    main()
