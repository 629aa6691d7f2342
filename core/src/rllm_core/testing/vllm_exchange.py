"""One scripted exchange with a vLLM server, played against the real server and against
:class:`~rllm_core.testing.fakevllm.FakeVllmServer` so that the fake is held to the real thing:
for every step the two must answer with the same status and a body of the same shape
(:func:`shape`: the keys, and the type of every value).

The steps (:func:`steps`) are what the vLLM sampler does with a server: health, models,
completions with token ids and logprobs (plain and streamed), loading and unloading adapters
(a bad folder, a duplicate name and an unknown name included), a full-weight reload between
``/pause`` and ``/resume``, a prefix-cache reset, the weight version a server reports, a
completion naming an adapter it does not hold and a worker method it lacks (whose error message
the sampler reads). The last steps put the startup weights back, so a shared server is left as
it was found.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "Step", "play", "shape", "steps"]


@dataclass(frozen=True)
class Step:
    """One request: ``name`` says what it checks."""

    name: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    stream: bool = False
    says: str | None = None
    """Words the answer's body must hold where the sampler reads them (an error message)."""


@dataclass(frozen=True)
class Answer:
    """What a server answered one step with: its status, the shape of its body (a list of
    event shapes for a stream) and, for a step with ``says``, whether the body held those
    words."""

    step: str
    status: int
    shape: Any
    said: bool | None = None


def shape(value: Any) -> Any:
    """The shape of a JSON value: a dict maps each key to the shape of its value, a list is the
    shape of its first item in a list (``[]`` when empty), a scalar is its type's name (an int
    and a float are both ``"number"``; ``None`` is ``"null"``)."""
    if isinstance(value, dict):
        # Top-logprob maps are keyed by the token itself.
        return {
            "token_id:<id>" if key.startswith("token_id:") else key: shape(item)
            for key, item in sorted(value.items())
        }
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _completion(model: str | None, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": [1, 9690, 198, 2683, 359, 253],
        "max_tokens": 4,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "seed": 7,
        "n": 1,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "stream": stream,
    }
    if model is not None:
        body["model"] = model
    return body


def steps(*, model: str, adapter: str, weights: str, startup: str) -> list[Step]:
    """The exchange, for a server whose served model name is ``model``: ``adapter`` is a PEFT
    adapter folder it can load, ``weights`` a model folder it can reload, ``startup`` the folder
    it started with (reloaded at the end)."""

    def post(name: str, path: str, body: dict[str, Any] | None = None) -> Step:
        return Step(name, "POST", path, body)

    def load(name: str, adapter_name: str, path: str | None) -> Step:
        body = {"lora_name": adapter_name} | ({"lora_path": path} if path else {})
        return post(name, "/v1/load_lora_adapter", body)

    def rpc(name: str, method: str | None, **body: Any) -> Step:
        return post(name, "/collective_rpc", ({"method": method} if method else {}) | body)

    def reload(name: str, folder: str) -> Step:
        return rpc(name, "reload_weights", kwargs={"weights_path": folder})

    completions = "/v1/completions"
    return [
        Step("health", "GET", "/health"),
        Step("models", "GET", "/v1/models"),
        post("completion", completions, _completion(model)),
        Step("completion streamed", "POST", completions, _completion(model, stream=True), True),
        load("load adapter", "x-v1", adapter),
        load("load it again", "x-v1", adapter),
        load("load a missing folder", "x-v2", adapter + "-missing"),
        load("load without a folder", "x-v3", None),
        Step("models with the adapter", "GET", "/v1/models"),
        post("completion on the adapter", completions, _completion("x-v1")),
        post("completion on an unknown adapter", completions, _completion("x-v9")),
        post("unload adapter", "/v1/unload_lora_adapter", {"lora_name": "x-v1"}),
        post("unload it again", "/v1/unload_lora_adapter", {"lora_name": "x-v1"}),
        post("pause", "/pause?mode=wait"),
        Step("is paused", "GET", "/is_paused"),
        reload("reload weights", weights),
        post("reset prefix cache", "/reset_prefix_cache"),
        post("set weight version", "/update_weight_version", {"new_version": "1"}),
        Step("weight version", "GET", "/weight_info"),
        post("resume", "/resume"),
        post("completion on new weights", completions, _completion(model)),
        rpc("rpc without a method", None, args=[]),
        Step(
            "rpc of a method the worker lacks",
            "POST",
            "/collective_rpc",
            {"method": "rllm_no_such_method"},
            says="object has no attribute 'rllm_no_such_method'",
        ),
        rpc(
            "update_config (older vLLM's way)",
            "update_config",
            args=[{"model_config": {"model": weights}}],
        ),
        reload("reload the startup weights", startup),
        post("set weight version back", "/update_weight_version", {"new_version": "0"}),
        post("reset prefix cache again", "/reset_prefix_cache"),
    ]


def _body_shape(raw: bytes, stream: bool) -> Any:
    if stream:
        events = []
        for line in raw.decode("utf-8", "replace").splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                events.append("[DONE]" if data == "[DONE]" else shape(json.loads(data)))
        # The first and last events differ from the middle ones; how many there are does not.
        return events[:1] + events[-2:] if len(events) > 3 else events
    if not raw.strip():
        return "empty"
    try:
        return shape(json.loads(raw))
    except ValueError:
        return "text"


def play(url: str, script: list[Step], *, timeout_s: float = 120.0) -> list[Answer]:
    """Send every step of ``script`` to the server at ``url`` in order; what it answered."""
    answers = []
    for step in script:
        data = None if step.body is None else json.dumps(step.body).encode()
        request = urllib.request.Request(url + step.path, data=data, method=step.method)
        if data is not None:
            request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        said = None if step.says is None else step.says in raw.decode("utf-8", "replace")
        body_shape = _body_shape(raw, step.stream and status == 200)
        answers.append(Answer(step.name, status, body_shape, said))
    return answers
