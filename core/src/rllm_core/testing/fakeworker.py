"""A stand-in for a vLLM worker: the completions API with token ids, answered at once.

For tests and benchmarks of the gateway and of samplers over vLLM servers (``sampler:vllm``)
without a model. ``POST /v1/completions`` answers like vLLM does for a token-id prompt with
``return_token_ids`` and ``return_tokens_as_token_ids``; ``GET /health`` answers 200. The
completion is ``reply(prompt_ids, max_tokens, stop_ids)`` (by default: the last ``echo`` prompt
ids that are not stop tokens, then the first stop token, cut to ``max_tokens``), and each
token's logprob is :func:`~rllm_core.testing.samplers.scripted_logprob`-like, deterministic.
With ``stream: true`` the completion is sent as server-sent events, one token each (``token_ids``
and the ``token_id:<n>`` logprob strings, as vLLM streams them), ``token_delay_s`` apart, then
``[DONE]``.

Faults for tests: :meth:`FakeWorker.fail_next` queues canned error answers (a status, an
optional ``Retry-After``), :attr:`FakeWorker.healthy` turns ``/health`` into a 503,
:meth:`FakeWorker.hold` keeps completions open until :meth:`FakeWorker.release`, and
``legacy=True`` leaves out ``token_ids`` (ids only in the ``token_id:<n>`` strings, as older
vLLM versions answer). Every decoded request body is kept in :attr:`FakeWorker.requests`.

Run one on its own: ``python -m rllm_core.testing.fakeworker --port 9000`` (``--reply-ids
1,2,3`` answers every request with those ids and the first stop id).
"""

from __future__ import annotations

import argparse
import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from rllm_core.gateway.serving import AsgiServer

__all__ = ["FakeWorker", "echo_reply", "fake_logprob", "fixed_reply", "serve_forever"]

Reply = Callable[[list[int], int, list[int]], list[int]]


def echo_reply(echo: int = 16) -> Reply:
    """The default reply: the prompt's last ``echo`` non-stop ids, then the first stop id."""

    def reply(prompt: list[int], max_tokens: int, stops: list[int]) -> list[int]:
        stop_set = set(stops)
        tail = [t for t in prompt[-(echo + len(stops) + 8) :] if t not in stop_set][-echo:]
        return (tail + stops[:1])[:max_tokens]

    return reply


def fixed_reply(ids: Sequence[int]) -> Reply:
    """Always the same completion: ``ids``, then the request's first stop id."""
    body = list(ids)

    def reply(prompt: list[int], max_tokens: int, stops: list[int]) -> list[int]:
        return (body + stops[:1])[:max_tokens]

    return reply


def fake_logprob(token_id: int, position: int) -> float:
    return -float((token_id * 7 + position * 13) % 50 + 1) / 64.0


class _Body(msgspec.Struct):
    prompt: list[int] | str
    max_tokens: int = 16
    stop_token_ids: list[int] = []
    return_token_ids: bool = False
    model: str | None = None
    stream: bool = False


@dataclass
class _Fault:
    status: int
    retry_after: str | None
    message: str
    after_s: float = 0.0


_encode = msgspec.json.Encoder().encode
_decode_raw = msgspec.json.Decoder()
_decode_body = msgspec.json.Decoder(_Body)


class FakeWorker:
    """A fake vLLM worker; ``start()`` serves it in a background thread.

    ``delay_s`` makes every completion take that long (for load-balancing tests);
    ``token_delay_s`` spaces the tokens of a streamed completion.
    """

    def __init__(
        self,
        *,
        reply: Reply | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        legacy: bool = False,
        delay_s: float = 0.0,
        record: bool = True,
        token_delay_s: float = 0.0,
    ) -> None:
        self.reply = reply or echo_reply()
        self.legacy = legacy
        self.delay_s = delay_s
        self.token_delay_s = token_delay_s
        self.record = record
        self.healthy = True
        self.requests: list[dict[str, Any]] = []
        self.served = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._faults: deque[_Fault] = deque()
        self._held = False
        self._hold_after_tokens = 0
        self.server = AsgiServer(self, host=host, port=port, stop_timeout_s=2.0, name="fake-worker")

    # ---------------------------------------------------------------- control

    def fail_next(
        self,
        status: int,
        *,
        count: int = 1,
        retry_after: float | str | None = None,
        message: str = "injected failure",
        after_s: float = 0.0,
    ) -> None:
        """Answer the next ``count`` completion requests with ``status`` (and ``Retry-After``),
        each ``after_s`` seconds after it came in (a generation that ran that long, then failed)."""
        header = None if retry_after is None else str(retry_after)
        for _ in range(count):
            self._faults.append(_Fault(status, header, message, after_s))

    def hold(self, *, after_tokens: int = 0) -> None:
        """Keep completions open until :meth:`release`: a plain one is not answered, a
        streamed one sends its first ``after_tokens`` tokens and then nothing. Each one held
        counts in :attr:`in_flight` and is in :attr:`requests`, so a test can wait for it to
        arrive."""
        self._hold_after_tokens = after_tokens
        self._held = True

    def release(self) -> None:
        """Let held completions go on (:meth:`stop` releases them too)."""
        self._held = False

    async def _while_held(self) -> None:
        while self._held:
            await asyncio.sleep(0.005)

    def start(self) -> str:
        return self.server.start()

    def stop(self) -> None:
        self.release()
        self.server.stop()

    @property
    def url(self) -> str:
        return self.server.base_url

    def __enter__(self) -> FakeWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- ASGI

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        await self.handle(scope["method"], scope["path"], b"".join(chunks), send)

    async def handle(self, method: str, path: str, raw: bytes, send: Callable) -> None:
        """Answer one HTTP request (a subclass adds routes and falls back to this)."""
        if path == "/health":
            status = 200 if self.healthy else 503
            await _respond(send, status, b"" if self.healthy else b'{"error": "unhealthy"}')
        elif path == "/v1/completions" and method == "POST":
            await self._complete(raw, send)
        else:
            await _respond(send, 404, _encode({"detail": "Not Found"}))

    async def _complete(self, raw: bytes, send: Callable) -> None:
        if self.record:
            self.requests.append(_decode_raw.decode(raw))
        if self._faults:
            fault = self._faults.popleft()
            if fault.after_s:
                await asyncio.sleep(fault.after_s)
            headers = []
            if fault.retry_after is not None:
                headers.append((b"retry-after", fault.retry_after.encode()))
            body = _encode({"error": {"message": fault.message, "code": fault.status}})
            await _respond(send, fault.status, body, headers)
            return
        body = _decode_body.decode(raw)
        if isinstance(body.prompt, str):
            await _respond(send, 400, _encode({"error": {"message": "token ids only"}}))
            return
        refusal = self.admit(body)
        if refusal is not None:
            await _respond(send, refusal[0], refusal[1])
            return
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if not body.stream:
                await self._while_held()
            ids = self.reply(body.prompt, body.max_tokens, body.stop_token_ids)
            if body.stream:
                await self._stream(ids, body, send)
        finally:
            self.in_flight -= 1
        self.served += 1
        if not body.stream:
            await _respond(send, 200, self.answer(ids, body, len(body.prompt)))

    async def _stream(self, ids: Sequence[int], body: Any, send: Callable) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        stops = set(body.stop_token_ids)
        for position, token in enumerate(ids):
            if self._held and position >= self._hold_after_tokens:
                await self._while_held()
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            last = position == len(ids) - 1
            finish = None
            if last:
                finish = "stop" if token in stops else "length"
            logprob = fake_logprob(token, position)
            choice: dict[str, Any] = {
                "index": 0,
                "text": "",
                "logprobs": {
                    "text_offset": [0],
                    "token_logprobs": [logprob],
                    "tokens": [f"token_id:{token}"],
                    "top_logprobs": [{f"token_id:{token}": logprob}],
                },
                "finish_reason": finish,
                "stop_reason": token if finish == "stop" else None,
            }
            if body.return_token_ids and not self.legacy:
                choice["prompt_token_ids"] = list(body.prompt) if position == 0 else None
                choice["token_ids"] = [token]
            chunk: dict[str, Any] = {
                "id": "cmpl-fake",
                "object": "text_completion",
                "created": 0,
                "model": body.model or "fake",
                "choices": [choice],
            }
            if last:
                chunk["system_fingerprint"] = "fake-vllm"
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + _encode(chunk) + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    def admit(self, body: Any) -> tuple[int, bytes] | None:
        """``None`` to serve the decoded completion request ``body``, else the status and body
        to refuse it with (a subclass checks its ``model`` field)."""
        return None

    def answer(self, ids: Sequence[int], body: Any, prompt_tokens: int) -> bytes:
        """The vLLM-shaped completion for ``ids``."""
        stops = set(body.stop_token_ids)
        stopped = bool(ids) and ids[-1] in stops
        logprobs = [fake_logprob(t, i) for i, t in enumerate(ids)]
        choice: dict[str, Any] = {
            "index": 0,
            "text": "",
            "logprobs": {
                "text_offset": [0] * len(ids),
                "token_logprobs": logprobs,
                "tokens": [f"token_id:{t}" for t in ids],
                "top_logprobs": [{f"token_id:{t}": v} for t, v in zip(ids, logprobs, strict=True)],
            },
            "finish_reason": "stop" if stopped else "length",
            "stop_reason": ids[-1] if stopped else None,
            "prompt_logprobs": None,
            "routed_experts": None,
        }
        if body.return_token_ids and not self.legacy:
            choice["prompt_token_ids"] = list(body.prompt)
            choice["token_ids"] = list(ids)
        # The fields vLLM 0.32 answers with, so that the fake's answers have the real shape
        # (tests/test_vllm_real_exchange.py holds it to that).
        return _encode(
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "created": 0,
                "model": body.model or "fake",
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": "fake-vllm",
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + len(ids),
                    "completion_tokens": len(ids),
                    "prompt_tokens_details": None,
                    "completion_tokens_details": None,
                },
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        )


async def _respond(
    send: Callable, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fake vLLM worker answering at once.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--echo", type=int, default=16, help="completion length before the stop")
    parser.add_argument(
        "--reply-ids",
        default=None,
        help="comma-separated ids to answer every request with (then the first stop id)",
    )
    args = parser.parse_args(argv)
    reply = echo_reply(args.echo)
    if args.reply_ids:
        reply = fixed_reply([int(t) for t in args.reply_ids.split(",")])
    serve_forever(FakeWorker(reply=reply, host=args.host, port=args.port, record=False))


def serve_forever(worker: FakeWorker, *, announce: str | None = "fake worker") -> None:
    """Serve ``worker`` in this process until Ctrl-C, printing ``<announce> on <url>`` once it
    listens (nothing with ``announce=None``)."""
    from rllm_core.gateway.serving import new_event_loop

    async def run() -> None:
        url = await worker.server.astart()
        if announce is not None:
            print(f"{announce} on {url}", flush=True)
        await worker.server.wait()

    loop = new_event_loop()
    try:
        loop.run_until_complete(run())
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()


if __name__ == "__main__":
    main()
