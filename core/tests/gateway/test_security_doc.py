"""docs/security.md's table of what each token may do is what the gateway does: every row is
sent to a real gateway with the admin token and with a session token."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from rllm_core.gateway.server import Gateway
from rllm_core.testing.samplers import ScriptedSampler

DOC = Path(__file__).resolve().parents[3] / "docs" / "security.md"
HEADER = "| Method | Route | Admin token | Session token |"
OWN, OTHER = "a", "b"
BODIES = {
    "chat/completions": {"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "policy", "prompt": "hi"},
    "responses": {"model": "policy", "input": "hi"},
}
NO_TOKEN = "(no token needed)"


def table() -> list[tuple[str, str, str, str]]:
    """The rows of the token table: method, route, the admin token's and the session token's
    answer."""
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        method, route, admin, session = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((method, route.strip("`"), admin, session))
    return rows


ROWS = table()


@pytest.fixture
def gateway(serve, toy) -> Gateway:
    return serve(ScriptedSampler(lambda request: "fine", renderer=toy))


def send(gateway: Gateway, method: str, route: str, token: str | None) -> httpx.Response:
    path = re.sub(r"^/sessions/own\b", f"/sessions/{OWN}", route)
    path = re.sub(r"^/sessions/other\b", f"/sessions/{OTHER}", path)
    body = next((b for suffix, b in BODIES.items() if path.endswith(f"/v1/{suffix}")), None)
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30.0) as client:
        return client.request(method, path, json=body if method == "POST" else None)


def expect(answer: str, response: httpx.Response, what: str) -> None:
    if answer.startswith("yes"):
        assert response.is_success, (what, response.status_code, response.text)
    else:
        assert response.status_code == int(answer), (what, response.status_code, response.text)
        assert response.json()["error"]["code"] == "forbidden"


def test_the_table_covers_every_kind_of_route():
    routes = {(method, route) for method, route, _, _ in ROWS}
    assert len(routes) == len(ROWS) >= 12
    assert ("GET", "/sessions") in routes and ("GET", "/metrics") in routes
    assert any(route.startswith("/sessions/other") for _, route in routes)


@pytest.mark.parametrize(("method", "route", "admin", "session"), ROWS, ids=lambda v: str(v))
def test_each_token_reaches_what_the_doc_says(gateway, method, route, admin, session):
    own_token = gateway.session_token(OWN)
    # the other session has traces, as a sibling episode's would
    assert send(gateway, "POST", "/sessions/other/v1/chat/completions", gateway.token).is_success
    expect(session, send(gateway, method, route, own_token), f"session token: {method} {route}")
    expect(admin, send(gateway, method, route, gateway.token), f"admin token: {method} {route}")
    if NO_TOKEN in admin:
        assert send(gateway, method, route, None).is_success
    else:
        assert send(gateway, method, route, None).status_code == 401
