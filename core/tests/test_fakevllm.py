"""The fake vLLM server of the test kit answers vLLM's adapter, model, reload and cache
endpoints with vLLM's statuses, keeps their state, and fails or restarts on demand."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from rllm_core.testing.fakevllm import FakeVllmServer, Served, version_of


def call(server: FakeVllmServer, path: str, payload: dict | None = None) -> tuple[int, dict]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(server.url + path, data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        body, status = error.read(), error.code
    try:
        return status, json.loads(body) if body else {}
    except json.JSONDecodeError:
        return status, {"text": body.decode()}


def complete(server: FakeVllmServer, model: str | None) -> tuple[int, dict]:
    payload: dict = {"prompt": [1, 2, 3], "max_tokens": 4, "return_token_ids": True}
    if model is not None:
        payload["model"] = model
    return call(server, "/v1/completions", payload)


@pytest.fixture
def server():
    fake = FakeVllmServer(model="base")
    fake.start()
    yield fake
    fake.stop()


def adapter(root: Path, name: str, rank: int = 8) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank}))
    return str(folder)


def test_adapters_load_serve_list_and_unload(server, tmp_path):
    path = adapter(tmp_path, "v3")
    assert call(server, "/v1/load_lora_adapter", {"lora_name": "p-v3", "lora_path": path})[0] == 200
    status, again = call(server, "/v1/load_lora_adapter", {"lora_name": "p-v3", "lora_path": path})
    assert status == 400 and "has already been loaded" in again["error"]["message"]
    models = call(server, "/v1/models")[1]["data"]
    assert [(m["id"], m["root"]) for m in models] == [("base", "base"), ("p-v3", path)]
    status, answer = complete(server, "p-v3")
    assert status == 200 and answer["choices"][0]["token_ids"]
    assert complete(server, None)[0] == 200
    assert server.completions == [
        Served(model="p-v3", path=path, version=3),
        Served(model=None, path=None, version=0),
    ]
    assert call(server, "/v1/unload_lora_adapter", {"lora_name": "p-v3"})[0] == 200
    status, missing = call(server, "/v1/unload_lora_adapter", {"lora_name": "p-v3"})
    assert status == 404 and "cannot be found" in missing["error"]["message"]
    status, unknown = complete(server, "p-v3")
    assert status == 404 and unknown["error"]["message"] == "The model `p-v3` does not exist."
    assert (server.loads, server.unloads) == (1, 1)


def test_adapters_vllm_would_refuse_are_refused(server, tmp_path):
    status, body = call(
        server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path / "nope")}
    )
    assert status == 404 and "No adapter found" in body["error"]["message"]
    big = adapter(tmp_path, "big", rank=128)
    status, body = call(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": big})
    # vLLM raises this inside its worker and answers 500, not 400.
    assert status == 500 and "greater than max_lora_rank 64" in body["error"]["message"]
    server.fail_next_loads(1, status=503)
    ok = adapter(tmp_path, "ok")
    payload = {"lora_name": "x", "lora_path": ok}
    assert call(server, "/v1/load_lora_adapter", payload)[0] == 503
    assert call(server, "/v1/load_lora_adapter", payload)[0] == 200


def test_endpoints_exist_only_with_their_flags(tmp_path):
    with FakeVllmServer(runtime_lora=False, dev_mode=False) as fake:
        payload = {"lora_name": "x", "lora_path": adapter(tmp_path, "a")}
        assert call(fake, "/v1/load_lora_adapter", payload) == (404, {"detail": "Not Found"})
        assert call(fake, "/collective_rpc", {"method": "reload_weights"})[0] == 404
        assert call(fake, "/reset_prefix_cache", {})[0] == 404


def test_full_weights_reload_through_collective_rpc_and_the_cache_resets(server, tmp_path):
    folder = tmp_path / "v5"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    reload = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
    server.fail_next_reloads(1)
    assert call(server, "/collective_rpc", reload)[0] == 500
    assert server.weight_version == 0
    assert call(server, "/collective_rpc", reload)[0] == 200
    assert server.weight_version == 5
    complete(server, "base")
    assert server.served_on_stale_cache == 1
    assert call(server, "/reset_prefix_cache", {}) == (200, {"success": True})
    complete(server, "base")
    assert server.served_on_stale_cache == 1
    assert [c.version for c in server.completions] == [5, 5]
    assert call(server, "/collective_rpc", {"method": "no_such_method"})[0] == 500
    # vLLM 0.32 no longer takes update_config overrides of the model folder.
    update = {"method": "update_config", "args": [{"model_config": {"model": str(folder)}}]}
    status, body = call(server, "/collective_rpc", update)
    assert status == 500 and "_hf_config_revision" in body["error"]["message"]


def test_older_vllm_reloads_through_update_config(tmp_path):
    folder = tmp_path / "v2"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with FakeVllmServer(legacy_reload=True) as fake:
        update = {"method": "update_config", "args": [{"model_config": {"model": str(folder)}}]}
        reload = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
        status, body = call(fake, "/collective_rpc", reload)
        assert status == 500 and "unexpected keyword argument" in body["error"]["message"]
        assert call(fake, "/collective_rpc", update)[0] == 200
        assert call(fake, "/collective_rpc", {"method": "reload_weights"})[0] == 200
        assert fake.weight_version == 2


def test_a_reload_from_a_folder_it_cannot_load_kills_the_engine(server, tmp_path):
    reload = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "gone")}}
    assert call(server, "/collective_rpc", reload)[0] == 500
    assert complete(server, "base")[0] == 500
    assert call(server, "/health")[0] == 503
    server.restart(down_s=0.01, refuse=False)
    time.sleep(0.05)
    assert call(server, "/health")[0] == 200


def test_pause_holds_completions_until_resume_and_the_version_tag_is_kept(server):
    assert call(server, "/weight_info") == (200, {"weight_version": "default"})
    assert call(server, "/pause?mode=wait", {}) == (200, {"status": "paused"})
    assert call(server, "/is_paused") == (200, {"is_paused": True})
    done = []
    thread = threading.Thread(target=lambda: done.append(complete(server, "base")[0]))
    thread.start()
    time.sleep(0.2)
    assert done == []
    assert call(server, "/update_weight_version", {"new_version": "4"})[0] == 200
    assert call(server, "/resume", {}) == (200, {"status": "resumed"})
    thread.join(5)
    assert done == [200]
    assert call(server, "/weight_info") == (200, {"weight_version": "4"})
    server.restart(down_s=0.01, refuse=False)
    time.sleep(0.05)
    assert call(server, "/weight_info") == (200, {"weight_version": "default"})


def wait_for(condition, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_hold_keeps_a_completion_open_until_release(server):
    server.hold()
    done = []
    thread = threading.Thread(target=lambda: done.append(complete(server, "base")))
    thread.start()
    wait_for(lambda: server.in_flight == 1)
    assert len(server.requests) == 1 and done == []
    server.release()
    thread.join(5)
    assert done[0][0] == 200 and done[0][1]["choices"][0]["token_ids"]
    assert server.in_flight == 0


def test_hold_after_tokens_stops_a_stream_after_its_first_tokens(server):
    server.hold(after_tokens=1)
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "return_token_ids": True, "stream": True}
    connection = http.client.HTTPConnection(server.server.host, server.server.port, timeout=5)
    connection.request("POST", "/v1/completions", json.dumps(body))
    response = connection.getresponse()
    assert response.status == 200
    first = response.readline()
    assert json.loads(first.removeprefix(b"data: "))["choices"][0]["token_ids"] == [5]
    assert response.readline() == b"\n"
    assert server.in_flight == 1
    server.release()
    events = [line for line in response.read().split(b"\n") if line]
    connection.close()
    tokens = [json.loads(e.removeprefix(b"data: "))["choices"][0]["token_ids"] for e in events[:-1]]
    assert tokens == [[6], [7]] and events[-1] == b"data: [DONE]"


def test_a_restart_forgets_everything_and_is_down_for_a_while(server, tmp_path):
    path = adapter(tmp_path, "v1")
    call(server, "/v1/load_lora_adapter", {"lora_name": "p-v1", "lora_path": path})
    server.restart(down_s=0.3, refuse=True)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url + "/health", timeout=2)
    time.sleep(0.6)
    assert call(server, "/health")[0] == 200
    assert server.loaded() == [] and server.restarts == 1
    assert complete(server, "p-v1")[0] == 404
    server.restart(down_s=0.3, refuse=False)
    assert call(server, "/health")[0] == 503
    time.sleep(0.4)
    assert call(server, "/health")[0] == 200


def test_version_of_reads_the_folder_name():
    assert (version_of("/w/v12"), version_of("/w/latest"), version_of(None)) == (12, None, 0)
