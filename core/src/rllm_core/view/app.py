"""The ASGI app of ``rllm-core view``: the page (static files shipped in the package) and the
JSON API behind it, read-only.

Routes (every one ``GET``):

- ``/`` the page; ``/static/<file>`` its script and style sheet;
- ``/api/runs``; ``/api/run?run=NAME``; ``/api/metrics?run=NAME``;
- ``/api/episodes?run=NAME&offset=&limit=&step=&task=&termination=&group=&min_reward=&max_reward=``;
- ``/api/episode?run=NAME&id=EPISODE``; ``/api/tokens?run=NAME&id=EPISODE&call=INDEX``.

What each answers is :class:`~rllm_core.view.data.RunsView`'s method of the same name. A
problem is ``{"error": message}`` with 400 (a bad parameter, a folder that cannot be read) or
404 (no such run, episode or call).

Without a token the app answers only requests addressed to a loopback name (the ``Host``
header), so a page on another site cannot reach it through a name that resolves to
127.0.0.1. With a token every request must carry it: ``Authorization: Bearer <token>``, or the
cookie that opening ``/?token=<token>`` once sets.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import mimetypes
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from rllm_core.addresses import is_loopback
from rllm_core.inspection import InspectionError
from rllm_core.view.data import NotFound, RunsView

__all__ = ["STATIC", "ViewApp"]

log = logging.getLogger("rllm_core.view")

STATIC = Path(__file__).resolve().parent / "static"
"""The page's files, shipped in the package."""

_COOKIE = "rllm_view_token"

# The page loads nothing from elsewhere and cannot be framed; a browser enforces it.
_POLICY = (
    b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:;"
    b" frame-ancestors 'none'"
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ViewApp:
    """Serve ``view`` (a :class:`RunsView`) read-only; ``token`` when set is required."""

    def __init__(self, view: RunsView, *, token: str | None = None) -> None:
        self.view = view
        self.token = token
        self._api: dict[str, Callable[[dict[str, str]], Any]] = {
            "/api/runs": lambda q: view.runs(),
            "/api/run": lambda q: view.run(_required(q, "run")),
            "/api/metrics": lambda q: view.metrics(_required(q, "run")),
            "/api/episodes": lambda q: view.episodes(_required(q, "run"), q),
            "/api/episode": lambda q: view.episode(_required(q, "run"), _required(q, "id")),
            "/api/tokens": lambda q: view.tokens(_required(q, "run"), _required(q, "id"), _call(q)),
        }
        self._static = {p.name: p for p in STATIC.iterdir() if p.is_file()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        status, headers, body = await self._answer(scope)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    async def _answer(self, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        path: str = scope["path"]
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        if scope["method"] not in ("GET", "HEAD"):
            return _json(405, {"error": f"{scope['method']} is not served; the view is read-only"})
        denied = self._denied(headers, query, path)
        if denied is not None:
            return denied
        if self.token is not None and path == "/" and "token" in query:
            cookie = f"{_COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            return 303, [(b"location", b"/"), (b"set-cookie", cookie.encode())], b""
        if path in ("/", "/index.html"):
            return self._file("index.html")
        if path.startswith("/static/"):
            return self._file(path.removeprefix("/static/"))
        handler = self._api.get(path)
        if handler is None:
            return _json(404, {"error": f"no page {path!r}; the view serves / and /api/..."})
        try:
            return _json(200, await asyncio.to_thread(handler, query))
        except NotFound as exc:
            return _json(404, {"error": str(exc)})
        except InspectionError as exc:
            return _json(400, {"error": str(exc)})
        except Exception as exc:
            log.exception("GET %s failed", path)
            return _json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    def _denied(
        self, headers: dict[str, str], query: dict[str, str], path: str
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        if self.token is None:
            host = headers.get("host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host and not is_loopback(name.strip("[]")):
                return _json(
                    403,
                    {
                        "error": f"Host {host!r} is not a loopback name; this view serves"
                        " 127.0.0.1 or localhost only (start it with --token to serve others)"
                    },
                )
            return None
        given = [query.get("token", "")] if path == "/" else []
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer "):
            given.append(auth[7:])
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == _COOKIE:
                given.append(value)
        if any(hmac.compare_digest(g.encode(), self.token.encode()) for g in given if g):
            return None
        return _json(
            401,
            {
                "error": "missing or wrong token: open /?token=<token> once (the token"
                " `rllm-core view` was started with) or send 'Authorization: Bearer <token>'"
            },
        )

    def _file(self, name: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        path = self._static.get(name)
        if path is None:
            return _json(404, {"error": f"no file {name!r} in the view's static files"})
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        headers = [
            (b"content-type", kind.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-content-type-options", b"nosniff"),
        ]
        if name == "index.html":
            headers.append((b"content-security-policy", _POLICY))
        return 200, headers, path.read_bytes()


def _json(status: int, data: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    # msgspec writes a NaN or an infinity as null, which JSON.parse reads.
    body = msgspec.json.encode(data)
    return (
        status,
        [(b"content-type", b"application/json"), (b"cache-control", b"no-store")],
        body,
    )


def _required(query: dict[str, str], key: str) -> str:
    value = query.get(key)
    if not value:
        raise InspectionError(f"the request names no {key}; add ?{key}=... to the URL")
    return value


def _call(query: dict[str, str]) -> int:
    value = _required(query, "call")
    try:
        return int(value)
    except ValueError:
        raise InspectionError(f"call={value!r} is not a call's index (0, 1, ...)") from None
