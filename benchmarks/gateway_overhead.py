"""Gateway overhead: what the session gateway costs per model call, on top of the model server.

Three processes: a fake vLLM worker that answers every completion at once with the same token
ids (``python -m rllm_core.testing.fakeworker``), the gateway (``rllm-core gateway serve``
with the chatml renderer over the SmolLM2 tokenizer and the memory trace store), and this
script, a light asyncio HTTP/1.1 client (the gateway's own upstream client, ~0.05 ms per
request).

For each mode (plain, then cumulative):

1. Load: 64 concurrent sessions x 10 turns. Each turn adds a user message of ~200 words and
   sends the whole conversation, as an agent does; the assistant reply goes back into the
   history. Reported: the gateway process's CPU time per request (from /proc, the main figure:
   it does not depend on the client), requests/s, and p50/p99 latency.
2. The same number of requests, with token-id prompts of the same lengths, sent directly to the
   worker at the same concurrency: the baseline, side by side.
3. One request at a time (8 sessions x 10 turns, sequential), through the gateway and direct:
   the pure overhead is the difference of the p50 latencies. The goal is judged on ~200-word
   turns; the same row with short turns (~5 words) shows the fixed cost of a request apart
   from the work that grows with the text added.

Each phase runs ``--repeat`` times (default 3): the load figures are those of the run with the
median gateway CPU (every run's figure is in the JSON), the one-at-a-time figures pool all runs.

Then, unless ``--no-parts``, where the time goes: the gateway's HTTP stack alone (a
pass-through server, uvicorn in and the gateway's HTTP client out, no engine: the floor under
the overhead), the gateway's application called in this process with an instant sampler (no
HTTP at all), and the text work inside a request (encoding the new message, rendering the
conversation in plain mode).

Goals: <= 0.8 ms gateway CPU per request in plain mode, <= 1.2 ms in cumulative mode, and a
one-at-a-time overhead <= 0.5 ms at p50.

Usage::

    python benchmarks/gateway_overhead.py            # a table
    python benchmarks/gateway_overhead.py --json     # one JSON object with every figure

Linux only (CPU time is read from /proc/<pid>/task/*/schedstat, or /proc/<pid>/stat).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rllm_core.types import SampleRequest, SamplingParams
from rllm_sampler_vllm.httpclient import HttpClient, Origin
from rllm_sampler_vllm.pool import completion_body

GOALS = {"plain": 0.8, "cumulative": 1.2}
OVERHEAD_GOAL_MS = 0.5
REPLY = (
    "I looked at the files you listed. The configuration loads first, then the worker reads"
    " the queue and writes one result per task. Nothing else is needed for this step."
)
_WORD_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from"
    " or one had by word but not what all were we when your can said there use an each which"
    " she do how their if will up other about out many then them these so some her would make"
    " like him into time has look two more write go see number no way could people my than"
    " first water been call who oil its now find long down day did get come made may part"
    " server queue worker token model prompt reply session trace buffer shell file folder test"
    " error build install config value result batch step agent tool command output"
)
WORDS = _WORD_TEXT.split()

_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder().encode


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """CPU time of a process (all its threads): the nanosecond run times in
    /proc/<pid>/task/*/schedstat, or, without schedstat, user + system clock ticks (10 ms
    steps: too coarse for a few hundred sub-millisecond requests) from /proc/<pid>/stat."""
    try:
        return (
            sum(
                int((task / "schedstat").read_text().split()[0])
                for task in Path(f"/proc/{pid}/task").iterdir()
            )
            / 1e9
        )
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank quantile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


class Process:
    """A child process that prints one line once it serves."""

    def __init__(self, args: list[str], ready: str) -> None:
        self.popen = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.popen.stdout is not None
        while True:
            line = self.popen.stdout.readline()
            if not line:
                raise RuntimeError(
                    f"{args[2]} exited before serving: {self.popen.stderr.read()}"  # type: ignore[union-attr]
                )
            if ready in line:
                break

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.kill()


@dataclass
class Phase:
    """Latencies and CPU of one batch of requests."""

    requests: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    gateway_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    prompt_tokens: list[int] = field(default_factory=list)

    def merge(self, other: Phase) -> None:
        self.requests += other.requests
        self.wall_s += other.wall_s
        self.latencies_ms += other.latencies_ms
        self.gateway_cpu_s += other.gateway_cpu_s
        self.client_cpu_s += other.client_cpu_s
        self.prompt_tokens += other.prompt_tokens

    def figures(self) -> dict[str, float]:
        return {
            "requests": self.requests,
            "wall_s": round(self.wall_s, 3),
            "requests_per_s": round(self.requests / self.wall_s, 1),
            "p50_ms": round(percentile(self.latencies_ms, 0.50), 3),
            "p99_ms": round(percentile(self.latencies_ms, 0.99), 3),
            "gateway_cpu_ms_per_request": round(self.gateway_cpu_s / self.requests * 1000, 3),
            "client_cpu_ms_per_request": round(self.client_cpu_s / self.requests * 1000, 3),
        }


def user_message(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


async def conversation(
    client: HttpClient,
    origin: Origin,
    session: str,
    turns: int,
    words: int,
    rng: random.Random,
    phase: Phase,
) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    path = f"/sessions/{session}/v1/chat/completions"
    for _ in range(turns):
        messages.append({"role": "user", "content": user_message(rng, words)})
        body = _encode({"model": "policy", "messages": messages, "max_tokens": 128})
        started = time.perf_counter()
        response = await client.request(
            "POST", origin, path, body=body, headers={"content-type": "application/json"}
        )
        phase.latencies_ms.append((time.perf_counter() - started) * 1000)
        if response.status != 200:
            raise RuntimeError(f"gateway answered {response.status}: {response.body[:300]!r}")
        answer = _decode.decode(response.body)
        phase.prompt_tokens.append(answer["usage"]["prompt_tokens"])
        messages.append(
            {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
        )
        phase.requests += 1


async def direct(
    client: HttpClient, origin: Origin, lengths: list[int], reply_len: int, phase: Phase
) -> None:
    for length in lengths:
        body = upstream_body(length)
        started = time.perf_counter()
        response = await client.request(
            "POST",
            origin,
            "/v1/completions",
            body=body,
            headers={"content-type": "application/json"},
        )
        phase.latencies_ms.append((time.perf_counter() - started) * 1000)
        answer = _decode.decode(response.body)
        assert len(answer["choices"][0]["logprobs"]["tokens"]) == reply_len + 1
        phase.requests += 1


def measure(coro_factory, gateway_pid: int | None) -> Phase:
    """Run one phase on a fresh loop, with CPU accounting around it."""
    phase = Phase()

    async def body() -> None:
        client = HttpClient(max_connections=256)
        try:
            await coro_factory(client, phase)
        finally:
            await client.aclose()

    gateway_before = cpu_seconds(gateway_pid) if gateway_pid else 0.0
    client_before = time.process_time()
    started = time.perf_counter()
    asyncio.run(body())
    phase.wall_s = time.perf_counter() - started
    phase.client_cpu_s = time.process_time() - client_before
    if gateway_pid:
        phase.gateway_cpu_s = cpu_seconds(gateway_pid) - gateway_before
    return phase


def run_mode(
    mode: str, worker_url: str, tokenizer: str, args: argparse.Namespace, reply_len: int
) -> dict[str, Any]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "rllm_core.cli",
        "gateway",
        "serve",
        "--port",
        str(port),
        "--upstream",
        worker_url,
        "--renderer",
        "chatml",
        "--tokenizer",
        tokenizer,
        "--trace-store",
        "memory",
        "--no-auth",
        "--log-level",
        "warning",
        "--token-mode",
        mode,
    ]
    gateway = Process(command, "rllm-core gateway on")
    origin = Origin.parse(f"http://127.0.0.1:{port}")
    worker = Origin.parse(worker_url)
    rng = random.Random(f"{mode}-load")
    try:

        async def warm(client, phase):
            await asyncio.gather(
                *(
                    conversation(client, origin, f"warm-{n}", args.turns, args.words, rng, phase)
                    for n in range(8)
                )
            )

        measure(warm, None)

        loads: list[tuple[Phase, Phase]] = []
        for rep in range(args.repeat):

            async def load(client, phase, rep=rep):
                await asyncio.gather(
                    *(
                        conversation(
                            client, origin, f"load{rep}-{n}", args.turns, args.words, rng, phase
                        )
                        for n in range(args.sessions)
                    )
                )

            loaded = measure(load, gateway.pid)
            lengths = loaded.prompt_tokens
            per_task = [lengths[n :: args.sessions] for n in range(args.sessions)]

            async def load_direct(client, phase, per_task=per_task):
                await asyncio.gather(
                    *(direct(client, worker, part, reply_len, phase) for part in per_task)
                )

            loads.append((loaded, measure(load_direct, None)))

        serial_runs = {}
        for key, words in (
            ("one_at_a_time", args.words),
            ("one_at_a_time_short", args.short_words),
        ):
            one, one_direct = Phase(), Phase()
            for rep in range(args.repeat):

                async def serial(client, phase, rep=rep, key=key, words=words):
                    for n in range(args.serial_sessions):
                        await conversation(
                            client, origin, f"{key}{rep}-{n}", args.turns, words, rng, phase
                        )

                one.merge(measure(serial, gateway.pid))

                async def serial_direct(client, phase, one=one):
                    await direct(
                        client,
                        worker,
                        one.prompt_tokens[-args.serial_sessions * args.turns :],
                        reply_len,
                        phase,
                    )

                one_direct.merge(measure(serial_direct, None))
            serial_runs[key] = (one, one_direct)
    finally:
        gateway.stop()
    loads.sort(key=lambda pair: pair[0].gateway_cpu_s / pair[0].requests)
    loaded, loaded_direct = loads[len(loads) // 2]
    load_figures = loaded.figures()
    serial_figures = {}
    for key, (one, one_direct) in serial_runs.items():
        through, straight = one.figures(), one_direct.figures()
        serial_figures[key] = {
            "gateway": through,
            "direct": straight,
            "overhead_p50_ms": round(through["p50_ms"] - straight["p50_ms"], 3),
            "mean_prompt_tokens": round(sum(one.prompt_tokens) / len(one.prompt_tokens), 1),
        }
    overhead = serial_figures["one_at_a_time"]["overhead_p50_ms"]
    cpu = load_figures["gateway_cpu_ms_per_request"]
    return {
        "mode": mode,
        "load": {
            "gateway": load_figures,
            "direct": loaded_direct.figures(),
            "gateway_cpu_ms_per_request_each_run": sorted(
                pair[0].figures()["gateway_cpu_ms_per_request"] for pair in loads
            ),
        },
        **serial_figures,
        "mean_prompt_tokens": round(sum(loaded.prompt_tokens) / len(loaded.prompt_tokens), 1),
        "goals": {
            "gateway_cpu_ms_per_request": {
                "goal": GOALS[mode],
                "value": cpu,
                "pass": cpu <= GOALS[mode],
            },
            "overhead_p50_ms": {
                "goal": OVERHEAD_GOAL_MS,
                "value": round(overhead, 3),
                "pass": overhead <= OVERHEAD_GOAL_MS,
            },
        },
    }


# ------------------------------------------------------------------ where the time goes


def upstream_body(prompt_tokens: int) -> bytes:
    """The completion request the gateway's vLLM sampler sends, with a token-id prompt of that
    length."""
    request = SampleRequest(
        prompt_token_ids=[(i * 7919) % 49000 + 10 for i in range(prompt_tokens)],
        params=SamplingParams(max_tokens=128, temperature=1.0, top_p=1.0, stop_token_ids=(2, 0)),
    )
    return completion_body(request)


def serve_pass_through(port: int, worker_url: str, prompt_tokens: int) -> None:
    """Serve the HTTP stack of the gateway with no engine: uvicorn and the raw ASGI dispatch
    in, the gateway's HTTP client out (one fixed completion request per request), the
    worker's answer back. What it costs is the floor under the gateway's overhead."""
    import uvloop
    from rllm_core.gateway.serving import AsgiServer

    worker = Origin.parse(worker_url)
    body = upstream_body(prompt_tokens)
    headers = {"content-type": "application/json"}
    clients: list[HttpClient] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        if not clients:
            clients.append(HttpClient())
        answer = await clients[0].request(
            "POST", worker, "/v1/completions", body=body, headers=headers
        )
        length = str(len(answer.body)).encode()
        start = [(b"content-type", b"application/json"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": 200, "headers": start})
        await send({"type": "http.response.body", "body": answer.body})

    async def run() -> None:
        server = AsgiServer(app, port=port, name="pass-through")
        url = await server.astart()
        print(f"pass-through on {url}", flush=True)
        await server.wait()

    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvloop.run(run())


def pass_through_figures(worker_url: str, prompt_tokens: int, reply_len: int) -> dict[str, Any]:
    """CPU per request of the pass-through server under load and one at a time, and its
    one-at-a-time overhead over going to the worker directly."""
    port = free_port()
    command = [sys.executable, __file__, "--serve-pass-through", str(port)]
    command += ["--upstream", worker_url, "--prompt-tokens", str(prompt_tokens)]
    server = Process(command, "pass-through on")
    through, worker = Origin.parse(f"http://127.0.0.1:{port}"), Origin.parse(worker_url)
    body = upstream_body(prompt_tokens)
    headers = {"content-type": "application/json"}

    async def send(client: HttpClient, origin: Origin, count: int, phase: Phase) -> None:
        for _ in range(count):
            started = time.perf_counter()
            answer = await client.request(
                "POST", origin, "/v1/completions", body=body, headers=headers
            )
            phase.latencies_ms.append((time.perf_counter() - started) * 1000)
            assert (
                answer.status == 200
                and len(_decode.decode(answer.body)["choices"][0]["logprobs"]["tokens"])
                == reply_len + 1
            )
            phase.requests += 1

    try:
        measure(lambda client, phase: send(client, through, 50, phase), None)
        one, direct_one = Phase(), Phase()
        for _ in range(3):
            one.merge(measure(lambda client, phase: send(client, through, 200, phase), server.pid))
            direct_one.merge(measure(lambda client, phase: send(client, worker, 200, phase), None))

        async def load(client: HttpClient, phase: Phase) -> None:
            await asyncio.gather(*(send(client, through, 10, phase) for _ in range(64)))

        loaded = measure(load, server.pid)
    finally:
        server.stop()
    return {
        "load_cpu_ms_per_request": loaded.figures()["gateway_cpu_ms_per_request"],
        "one_at_a_time_cpu_ms_per_request": one.figures()["gateway_cpu_ms_per_request"],
        "one_at_a_time_overhead_p50_ms": round(
            one.figures()["p50_ms"] - direct_one.figures()["p50_ms"], 3
        ),
    }


class _InstantSampler:
    """Answers every request at once with the same completion."""

    weight_version = 0

    def __init__(self, completion: list[int]) -> None:
        self.completion = completion

    async def sample(self, request: Any) -> Any:
        from rllm_core.types import SampleResult

        ids = list(self.completion)
        return SampleResult(
            completion_token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            weight_version=0,
        )


def in_process_figures(
    tokenizer: str, mode: str, words: int, reply_ids: list[int], *, cold: bool = False
) -> float:
    """CPU per request of the gateway's application (request decoding, the engine with the
    chatml renderer and the memory trace store, the response) called in this process with an
    instant sampler: everything but the HTTP server and the upstream call. 16 sessions x 10
    turns after a warm-up, turn by turn across sessions as under load.

    ``cold`` runs a Python loop over 8 MB before each request (outside the measured time),
    evicting the application's data from the CPU caches and the interpreter's branch history,
    as the client's and the worker's interpreters do between two requests sent one at a
    time."""
    from rllm_core.gateway.app import GatewayApp
    from rllm_core.gateway.engine import GatewayEngine
    from rllm_core.plugins.manager import PluginManager
    from rllm_core.types import SamplingParams

    manager = PluginManager()
    renderer = manager.get("renderer", "chatml").build({"tokenizer": tokenizer})
    engine = GatewayEngine(
        renderer=renderer,
        sampler=_InstantSampler([*reply_ids, renderer.stop_token_ids()[0]]),
        trace_store=manager.get("trace_store", "memory").build({}),
        cumulative=mode == "cumulative",
    )
    app = GatewayApp(engine, token=None, default_params=SamplingParams(max_tokens=256))
    rng = random.Random(f"{mode}-{words}-in-process")
    scratch = bytearray(8 << 20)

    async def call(session: str, body: bytes) -> bytes:
        scope = {
            "type": "http",
            "method": "POST",
            "path": f"/sessions/{session}/v1/chat/completions",
            "headers": [(b"content-length", str(len(body)).encode())],
            "query_string": b"",
        }
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        assert sent[0]["status"] == 200, sent
        return sent[1]["body"]

    async def sessions(prefix: str, count: int) -> float:
        histories = [
            [{"role": "system", "content": "You are a careful agent."}] for _ in range(count)
        ]
        spent = 0.0
        for _ in range(10):
            for n, messages in enumerate(histories):
                messages.append({"role": "user", "content": user_message(rng, words)})
                body = _encode({"model": "policy", "messages": messages, "max_tokens": 128})
                if cold:
                    for at in range(0, len(scratch), 64):
                        scratch[at] ^= 1
                started = time.process_time()
                answer = await call(f"{prefix}-{n}", body)
                spent += time.process_time() - started
                content = _decode.decode(answer)["choices"][0]["message"]["content"]
                messages.append({"role": "assistant", "content": content})
        return spent / (10 * count)

    async def run() -> float:
        await sessions("warm", 4)
        return await sessions("timed", 16)

    # The garbage collector as `rllm-core gateway serve` sets it.
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    try:
        return round(asyncio.run(run()) * 1000, 3)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def tokenizing_figures(tokenizer: str, words: int) -> dict[str, float]:
    """CPU of the text work inside a request: encoding a new message of ``words`` words with
    the chatml renderer (its word cache warm: the messages draw on a vocabulary of ~150 words)
    and with one call of the tokenizers library, and rendering a whole conversation from the
    renderer's caches as plain mode does (mean over turns 1-10, and turn 10)."""
    from rllm_core.plugins.manager import PluginManager
    from rllm_core.types import Message
    from tokenizers import Tokenizer

    renderer = PluginManager().get("renderer", "chatml").build({"tokenizer": tokenizer})
    library = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    rng = random.Random("tokenizing")
    texts = ["user\n" + user_message(rng, words) for _ in range(300)]
    for text in texts[:100]:
        renderer.encode(text)

    def cpu_ms(work: Any, items: list[Any]) -> float:
        started = time.process_time()
        for item in items:
            work(item)
        return round((time.process_time() - started) / len(items) * 1000, 3)

    messages = [Message(role="system", content="You are a careful agent.")]
    conversations = []
    for _ in range(10):
        messages = [*messages, Message(role="user", content=user_message(rng, words))]
        conversations.append(messages)
        messages = [*messages, Message(role="assistant", content=REPLY)]
    for conversation in conversations:
        renderer.render(conversation, add_generation_prompt=True)

    def render(conversation: list[Message]) -> None:
        renderer.render(conversation, add_generation_prompt=True)

    return {
        "encode_message_ms": cpu_ms(renderer.encode, texts[100:] * 3),
        "encode_message_library_ms": cpu_ms(
            lambda text: library.encode(text, add_special_tokens=False).ids, texts[100:] * 3
        ),
        "render_cached_mean_ms": cpu_ms(render, conversations * 20),
        "render_cached_turn10_ms": cpu_ms(render, conversations[-1:] * 100),
    }


def parts_figures(
    worker_url: str,
    tokenizer: str,
    args: argparse.Namespace,
    reply_ids: list[int],
    prompt_tokens: int,
) -> dict[str, Any]:
    """Where the gateway's time goes: its HTTP stack alone, its application in process, and
    the text work inside a request."""
    return {
        "pass_through": pass_through_figures(worker_url, prompt_tokens, len(reply_ids)),
        "in_process_ms_per_request": {
            mode: {
                str(words): in_process_figures(tokenizer, mode, words, reply_ids)
                for words in (args.words, args.short_words)
            }
            for mode in args.modes.split(",")
        },
        "in_process_cold_ms_per_request": {
            mode: in_process_figures(tokenizer, mode, args.words, reply_ids, cold=True)
            for mode in args.modes.split(",")
        },
        "text": tokenizing_figures(tokenizer, args.words),
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        f"gateway overhead: {results['sessions']} sessions x {results['turns']} turns,"
        f" ~{results['words']} words added per turn, {results['reply_tokens']}-token replies,"
        f" chatml renderer (SmolLM2 tokenizer), memory trace store",
        "",
    ]
    header = (
        f"{'mode':<11} {'path':<8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'gw CPU ms/req':>14} {'client CPU ms/req':>18}"
    )
    sections = (
        (f"{results['sessions']} concurrent sessions, ~{results['words']} words a turn", "load"),
        (f"one at a time, ~{results['words']} words a turn", "one_at_a_time"),
        (f"one at a time, short turns (~{results['short_words']} words)", "one_at_a_time_short"),
    )
    for title, key in sections:
        lines += [title, header]
        for mode in results["modes"]:
            for path in ("gateway", "direct"):
                f = mode[key][path]
                gw = f"{f['gateway_cpu_ms_per_request']:.3f}" if path == "gateway" else "-"
                lines.append(
                    f"{mode['mode']:<11} {path:<8} {f['requests_per_s']:>8.0f} {f['p50_ms']:>8.3f}"
                    f" {f['p99_ms']:>8.3f} {gw:>14} {f['client_cpu_ms_per_request']:>18.3f}"
                )
            if key != "load":
                lines.append(
                    f"{mode['mode']:<11} overhead p50 {mode[key]['overhead_p50_ms']:.3f} ms"
                )
        lines.append("")
    parts = results.get("parts")
    if parts:
        through = parts["pass_through"]
        text = parts["text"]
        words, short = results["words"], results["short_words"]
        loaded = through["load_cpu_ms_per_request"]
        single = through["one_at_a_time_cpu_ms_per_request"]
        floor = through["one_at_a_time_overhead_p50_ms"]
        lines += [
            "where the time goes (CPU ms per request)",
            f"  HTTP stack alone (pass-through server, no engine): {loaded:.3f} under load,"
            f" {single:.3f} one at a time (overhead p50 {floor:.3f} ms)",
            "  application in process (request decoding, engine, renderer, trace store, response):",
        ]
        for mode, figures in parts["in_process_ms_per_request"].items():
            cold = parts["in_process_cold_ms_per_request"][mode]
            lines.append(
                f"    {mode:<11} ~{words} words {figures[str(words)]:.3f},"
                f" ~{short} words {figures[str(short)]:.3f};"
                f" ~{words} words with cold CPU caches {cold:.3f}"
            )
        lines += [
            f"  encoding one new ~{words}-word message: {text['encode_message_ms']:.3f} (chatml"
            f" renderer), {text['encode_message_library_ms']:.3f} (one tokenizers call)",
            "  rendering a conversation from the renderer's caches (plain mode):"
            f" {text['render_cached_mean_ms']:.3f} mean over turns 1-{results['turns']},"
            f" {text['render_cached_turn10_ms']:.3f} at turn 10",
            "",
        ]
    lines.append("goals")
    for mode in results["modes"]:
        for name, goal in mode["goals"].items():
            verdict = "PASS" if goal["pass"] else "FAIL"
            value = f"{goal['value']:>7.3f} <= {goal['goal']:<4}"
            lines.append(f"  {mode['mode']:<11} {name:<28} {value} {verdict}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument(
        "--short-words",
        type=int,
        default=5,
        help="words a turn in the one-at-a-time row that isolates the fixed per-request cost",
    )
    parser.add_argument("--serial-sessions", type=int, default=8)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each phase; the median load run is shown"
    )
    parser.add_argument("--modes", default="plain,cumulative")
    parser.add_argument(
        "--no-parts",
        action="store_true",
        help="skip measuring where the time goes (HTTP stack alone, application in process,"
        " text work)",
    )
    parser.add_argument("--serve-pass-through", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--prompt-tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_pass_through:
        serve_pass_through(args.serve_pass_through, args.upstream, args.prompt_tokens)
        return 0

    from rllm_core.plugins.manager import PluginManager
    from rllm_core.testing.tokenizers import smollm2_tokenizer_dir

    load_before = os.getloadavg()
    tokenizer = str(smollm2_tokenizer_dir())
    renderer = PluginManager().get("renderer", "chatml").build({"tokenizer": tokenizer})
    reply_ids = renderer.encode(REPLY)
    worker_port = free_port()
    worker = Process(
        [
            sys.executable,
            "-m",
            "rllm_core.testing.fakeworker",
            "--port",
            str(worker_port),
            "--reply-ids",
            ",".join(map(str, reply_ids)),
        ],
        "fake worker on",
    )
    worker_url = f"http://127.0.0.1:{worker_port}"
    try:
        modes = [
            run_mode(mode, worker_url, tokenizer, args, len(reply_ids))
            for mode in args.modes.split(",")
        ]
        parts = None
        if not args.no_parts:
            prompt_tokens = round(sum(m["mean_prompt_tokens"] for m in modes) / len(modes))
            parts = parts_figures(worker_url, tokenizer, args, reply_ids, prompt_tokens)
    finally:
        worker.stop()
    results = {
        "sessions": args.sessions,
        "turns": args.turns,
        "words": args.words,
        "short_words": args.short_words,
        "reply_tokens": len(reply_ids) + 1,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "repeat": args.repeat,
        "load_average_before": [round(x, 2) for x in load_before],
        "modes": modes,
        "parts": parts,
        "pass": all(g["pass"] for m in modes for g in m["goals"].values()),
    }
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0 if results["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
