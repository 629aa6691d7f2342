"""Gateway overhead: what the session gateway costs per model call, on top of the model server.

Three processes: a fake vLLM worker that answers every completion at once with the same token
ids (``python -m rllm_core.gateway.fakeworker``), the gateway (``rllm-core gateway serve``
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
   the pure overhead is the difference of the p50 latencies.

Each phase runs ``--repeat`` times (default 3): the load figures are those of the run with the
median gateway CPU (every run's figure is in the JSON), the one-at-a-time figures pool all runs.

Goals: <= 0.8 ms gateway CPU per request in plain mode, <= 1.2 ms in cumulative mode, and a
one-at-a-time overhead <= 0.5 ms at p50.

Usage::

    python benchmarks/gateway_overhead.py            # a table
    python benchmarks/gateway_overhead.py --json     # one JSON object with every figure

Linux only (CPU time is read from /proc/<pid>/stat).
"""

from __future__ import annotations

import argparse
import asyncio
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
from rllm_core.gateway.httpclient import HttpClient, Origin

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
    """User + system CPU time of a process (all its threads), from /proc."""
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
        body = _encode(
            {
                "prompt": [(i * 7919) % 49000 + 10 for i in range(length)],
                "max_tokens": 128,
                "temperature": 1.0,
                "top_p": 1.0,
                "stop_token_ids": [2, 0],
                "n": 1,
                "stream": False,
                "logprobs": 0,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
                "skip_special_tokens": False,
            }
        )
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
        assert len(answer["choices"][0]["token_ids"]) == reply_len + 1
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
        "--cumulative" if mode == "cumulative" else "--plain",
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

        one, one_direct = Phase(), Phase()
        for rep in range(args.repeat):

            async def serial(client, phase, rep=rep):
                for n in range(args.serial_sessions):
                    await conversation(
                        client, origin, f"one{rep}-{n}", args.turns, args.words, rng, phase
                    )

            one.merge(measure(serial, gateway.pid))

            async def serial_direct(client, phase):
                await direct(
                    client,
                    worker,
                    one.prompt_tokens[-args.serial_sessions * args.turns :],
                    reply_len,
                    phase,
                )

            one_direct.merge(measure(serial_direct, None))
    finally:
        gateway.stop()
    loads.sort(key=lambda pair: pair[0].gateway_cpu_s / pair[0].requests)
    loaded, loaded_direct = loads[len(loads) // 2]
    load_figures = loaded.figures()
    one_figures = one.figures()
    overhead = one_figures["p50_ms"] - one_direct.figures()["p50_ms"]
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
        "one_at_a_time": {
            "gateway": one_figures,
            "direct": one_direct.figures(),
            "overhead_p50_ms": round(overhead, 3),
        },
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
    for title, key in (("64 concurrent sessions", "load"), ("one at a time", "one_at_a_time")):
        lines += [title, header]
        for mode in results["modes"]:
            for path in ("gateway", "direct"):
                f = mode[key][path]
                gw = f"{f['gateway_cpu_ms_per_request']:.3f}" if path == "gateway" else "-"
                lines.append(
                    f"{mode['mode']:<11} {path:<8} {f['requests_per_s']:>8.0f} {f['p50_ms']:>8.3f}"
                    f" {f['p99_ms']:>8.3f} {gw:>14} {f['client_cpu_ms_per_request']:>18.3f}"
                )
        lines.append("")
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
    parser.add_argument("--serial-sessions", type=int, default=8)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each phase; the median load run is shown"
    )
    parser.add_argument("--modes", default="plain,cumulative")
    args = parser.parse_args()

    from rllm_core.plugins.manager import PluginManager
    from rllm_core.testing.tokenizers import smollm2_tokenizer_dir

    load_before = os.getloadavg()
    tokenizer = str(smollm2_tokenizer_dir())
    renderer = PluginManager().get_renderer("chatml").build({"tokenizer": tokenizer})
    reply_ids = renderer.encode(REPLY)
    worker_port = free_port()
    worker = Process(
        [
            sys.executable,
            "-m",
            "rllm_core.gateway.fakeworker",
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
    finally:
        worker.stop()
    results = {
        "sessions": args.sessions,
        "turns": args.turns,
        "words": args.words,
        "reply_tokens": len(reply_ids) + 1,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "repeat": args.repeat,
        "load_average_before": [round(x, 2) for x in load_before],
        "modes": modes,
        "pass": all(g["pass"] for m in modes for g in m["goals"].values()),
    }
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0 if results["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
