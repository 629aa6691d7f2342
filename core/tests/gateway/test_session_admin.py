"""The admin routes a run's gateway workers are driven through: ``POST /sessions/{id}/configure``
enforces sampling parameters, ``POST /sessions/{id}/release`` ends the session's token and hands
its traces over with ``?take=traces``, ``GET /sessions/{id}`` counts what its token was denied,
``POST /weight_version`` with ``model`` switches what a shared sampler sends, and
``model_calls`` in ``/metrics`` counts only model routes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from rllm_core.ports import SharedPool
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import SamplingParams


class SharedScripted(ScriptedSampler):
    """A scripted sampler that other processes could share: it keeps what it was told to send."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model: str | None = None

    def client_options(self) -> dict[str, Any]:
        return {}

    def served_policy(self) -> tuple[str | None, int]:
        return self.model, self.weight_version

    def use(self, model: str | None, version: int) -> None:
        self.model, self.weight_version = model, version


@pytest.fixture
def scripted(serve, toy):
    """``scripted(script)``: a gateway over a :class:`ScriptedSampler`, and the sampler."""

    def start(script: Any) -> tuple[Any, ScriptedSampler]:
        sampler = ScriptedSampler(script, renderer=toy)
        return serve(sampler), sampler

    return start


def admin(server) -> dict[str, str]:
    return {"authorization": f"Bearer {server.token}"}


def chat(server, sid: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/sessions/{sid}/v1/chat/completions",
        json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {token}"},
    )


def test_configure_enforces_the_sampling_parameters_on_every_call(scripted):
    server, sampler = scripted(["one", "two", "three"])
    enforced = SamplingParams(max_tokens=5, temperature=0.25, top_p=0.5, seed=11)
    answer = httpx.post(
        f"{server.base_url}/sessions/s-1/configure",
        json={"enforced": {"max_tokens": 5, "temperature": 0.25, "top_p": 0.5, "seed": 11}},
        headers=admin(server),
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["enforced"]["seed"] == 11
    token = httpx.post(f"{server.base_url}/sessions/s-1/token", headers=admin(server)).json()
    assert chat(server, "s-1", token["token"]).status_code == 200
    (request,) = sampler.requests
    assert (request.params.max_tokens, request.params.temperature) == (5, 0.25)
    assert (request.params.top_p, request.params.seed) == (0.5, enforced.seed)
    # null stops enforcing: the request's own parameters are sampled with again.
    cleared = httpx.post(
        f"{server.base_url}/sessions/s-1/configure", json={"enforced": None}, headers=admin(server)
    )
    assert cleared.status_code == 200
    assert chat(server, "s-1", token["token"]).status_code == 200
    assert sampler.requests[-1].params.seed is None


def test_a_configure_body_that_is_not_sampling_parameters_is_a_400_naming_it(scripted):
    server, _ = scripted([])
    for body in ({"enforced": {"temperature": "hot"}}, {"enforced": {"beam": 4}}, {}, [1]):
        answer = httpx.post(
            f"{server.base_url}/sessions/s-1/configure", json=body, headers=admin(server)
        )
        assert answer.status_code == 400, (body, answer.text)
        error = answer.json()["error"]
        assert (error["param"], error["code"]) == ("enforced", "invalid_value")
        assert '"enforced"' in error["message"]


def test_the_admin_routes_refuse_a_session_token(scripted):
    server, _ = scripted([])
    token = server.session_token("s-1")
    for path in ("/sessions/s-1/configure", "/sessions/s-1/release"):
        answer = httpx.post(
            f"{server.base_url}{path}",
            json={"enforced": None},
            headers={"authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 403, answer.text


def test_release_ends_the_token_keeps_the_traces_and_reports_the_denials(scripted):
    server, _ = scripted(["one"])
    token = server.session_token("s-1")
    assert chat(server, "s-1", token).status_code == 200
    denied = httpx.get(f"{server.base_url}/sessions", headers={"authorization": f"Bearer {token}"})
    assert denied.status_code == 403
    stats = httpx.get(f"{server.base_url}/sessions/s-1", headers=admin(server)).json()
    assert stats["denied"] == 1
    released = httpx.post(f"{server.base_url}/sessions/s-1/release", headers=admin(server))
    assert released.status_code == 200, released.text
    assert released.json() == {
        "session_id": "s-1",
        "object": "session",
        "released": True,
        "denied": 1,
    }
    assert chat(server, "s-1", token).status_code == 401
    traces = httpx.get(f"{server.base_url}/sessions/s-1/traces", headers=admin(server))
    assert traces.status_code == 200 and len(traces.json()["traces"]) == 1


def test_release_taking_the_traces_hands_over_the_chain_and_deletes_it(scripted, store):
    server, _ = scripted(["one", "two"])
    token = server.session_token("s-1")
    first = {"role": "user", "content": "hi"}
    for messages in ([first], [first, {"role": "assistant", "content": "one"}, first]):
        answer = httpx.post(
            f"{server.base_url}/sessions/s-1/v1/chat/completions",
            json={"model": "policy", "messages": messages},
            headers={"authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 200, answer.text
    chain = httpx.get(
        f"{server.base_url}/sessions/s-1/traces?format=chain", headers=admin(server)
    ).json()["records"]
    assert len(chain) == 2
    taken = httpx.post(
        f"{server.base_url}/sessions/s-1/release?take=traces", headers=admin(server)
    ).json()
    assert taken["records"] == chain
    assert store.chain("s-1") == []
    gone = httpx.get(f"{server.base_url}/sessions/s-1/traces", headers=admin(server))
    assert gone.status_code == 404
    wrong = httpx.post(f"{server.base_url}/sessions/s-2/release?take=all", headers=admin(server))
    assert wrong.status_code == 400
    assert wrong.json()["error"]["param"] == "take"


def test_announcing_a_model_switches_what_a_shared_sampler_sends(toy, serve):
    sampler = SharedScripted(["one"], renderer=toy)
    assert isinstance(sampler, SharedPool)
    server = serve(sampler)
    url = f"{server.base_url}/weight_version"
    answer = httpx.post(url, json={"version": 3, "model": "policy-v3"}, headers=admin(server))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"object": "weight_version", "version": 3, "model": "policy-v3"}
    assert sampler.served_policy() == ("policy-v3", 3)
    back = httpx.post(url, json={"version": 4, "model": None}, headers=admin(server))
    assert back.status_code == 200
    assert sampler.served_policy() == (None, 4)
    bad = httpx.post(url, json={"version": 5, "model": 7}, headers=admin(server))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"
    assert sampler.served_policy() == (None, 4)


def test_announcing_a_model_to_a_sampler_that_is_not_shared_is_a_409(scripted):
    server, sampler = scripted([])
    answer = httpx.post(
        f"{server.base_url}/weight_version",
        json={"version": 2, "model": "policy-v2"},
        headers=admin(server),
    )
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "no_model_switch"
    assert sampler.weight_version == 0


def test_model_calls_count_the_model_routes_only(scripted):
    server, _ = scripted(["one", "two"])
    token = server.session_token("s-1")
    assert chat(server, "s-1", token).status_code == 200
    httpx.get(f"{server.base_url}/sessions/s-1", headers=admin(server))
    httpx.get(f"{server.base_url}/v1/models", headers=admin(server))
    assert chat(server, "s-1", token).status_code == 200
    metrics = httpx.get(f"{server.base_url}/metrics", headers=admin(server)).json()
    assert metrics["model_calls"] == 2
    assert metrics["requests_served"] > 2
