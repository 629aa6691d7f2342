"""Gateway workers: W1 requests/s through ``rllm-core gateway serve --workers N``, side by side.

The load is ``gateway_overhead.py``'s W1 (64 concurrent sessions x 10 turns of ~200-word user
messages, the whole conversation sent every turn) against the same fake vLLM worker, for each
worker count (default 1, 2 and 4) and each token mode. Each session starts as a real client
does: ``POST /sessions/{id}/token`` on the gateway's address, then its turns go to the
``base_url`` that answer names (the owning worker's; ``--route front`` sends them through the
front instead, to measure its relay). Reported per row: requests/s, p50 and p99 latency, the
CPU per request of the whole gateway (the front and its workers, from /proc) and of the front
alone, and requests per gateway CPU-second (a fairer figure than requests/s when other jobs
share the machine). One worker runs no front. The goal: 2 workers >= 1.6x the requests/s of
one; it needs a core per worker besides the fake worker's and the client's.

Usage::

    python benchmarks/gateway_workers.py                 # a table
    python benchmarks/gateway_workers.py --json          # one JSON object
    python benchmarks/gateway_workers.py --workers 1,2 --modes plain --repeat 1
    python benchmarks/gateway_workers.py --dry-run       # the gateway commands, nothing started

Linux only (CPU time from /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from gateway_overhead import (
    REPLY,
    Process,
    conversation,
    cpu_seconds,
    free_port,
    measure,
)
from rllm_sampler_vllm.httpclient import Origin

SPEEDUP_GOAL = 1.6


def children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(child) for child in text]
    return found


def command(count: int, mode: str, port: int, worker_url: str, tokenizer: str) -> list[str]:
    """The ``gateway serve`` command line of one row."""
    return [
        *(sys.executable, "-m", "rllm_core.cli", "gateway", "serve", "--port", str(port)),
        *("--upstream", worker_url, "--renderer", "chatml", "--tokenizer", tokenizer),
        *("--trace-store", "memory", "--no-auth", "--log-level", "warning"),
        *("--token-mode", mode, "--workers", str(count)),
    ]


async def session(client, front: Origin, sid: str, turns: int, args: Any, rng, phase) -> None:
    """One client session: ask the gateway where the session lives, then talk to it there."""
    minted = await client.request("POST", front, f"/sessions/{sid}/token")
    if minted.status != 200:
        raise RuntimeError(f"the token route answered {minted.status}: {minted.body[:300]!r}")
    base_url = json.loads(minted.body)["base_url"]
    direct = args.route == "direct"
    origin = Origin.parse(base_url.split("/sessions/", 1)[0]) if direct else front
    await conversation(client, origin, sid, turns, args.words, rng, phase)


def run(count: int, mode: str, worker_url: str, tokenizer: str, args: Any) -> dict[str, Any]:
    import asyncio

    port = free_port()
    gateway = Process(command(count, mode, port, worker_url, tokenizer), "rllm-core gateway on")
    pids = [gateway.pid, *(children(gateway.pid) if count > 1 else [])]
    front = Origin.parse(f"http://127.0.0.1:{port}")
    rng = random.Random(f"{mode}-{count}")
    try:

        async def warm(client, phase):
            await asyncio.gather(
                *(session(client, front, f"warm-{n}", 2, args, rng, phase) for n in range(16))
            )

        measure(warm, None)
        rows = []
        for rep in range(args.repeat):

            async def load(client, phase, rep=rep):
                await asyncio.gather(
                    *(
                        session(client, front, f"load{rep}-{n}", args.turns, args, rng, phase)
                        for n in range(args.sessions)
                    )
                )

            before = [cpu_seconds(pid) for pid in pids]
            phase = measure(load, None)
            spent = [cpu_seconds(pid) - start for pid, start in zip(pids, before, strict=True)]
            figures = phase.figures()
            figures["gateway_cpu_ms_per_request"] = round(sum(spent) / phase.requests * 1000, 3)
            figures["front_cpu_ms_per_request"] = (
                round(spent[0] / phase.requests * 1000, 3) if count > 1 else 0.0
            )
            figures["requests_per_gateway_cpu_s"] = round(phase.requests / sum(spent), 1)
            figures["gateway_cores_busy"] = round(sum(spent) / phase.wall_s, 2)
            rows.append(figures)
    finally:
        gateway.stop()
    best = sorted(rows, key=lambda row: row["requests_per_s"])[len(rows) // 2]
    return {
        "workers": count,
        "mode": mode,
        **best,
        "requests_per_s_runs": [row["requests_per_s"] for row in rows],
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        f"W1: {results['sessions']} sessions x {results['turns']} turns, ~{results['words']}"
        f" words a turn, turns sent {results['route']}; {results['cpu_count']} CPUs, load"
        f" average before {results['load_average_before']}",
        "",
        f"{'mode':<11}{'workers':>8}{'req/s':>9}{'vs 1':>7}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'CPU ms/req':>12}{'front ms/req':>14}{'req/CPU-s':>11}{'cores':>7}{'client ms/req':>15}",
    ]
    for row in results["rows"]:
        lines.append(
            f"{row['mode']:<11}{row['workers']:>8}{row['requests_per_s']:>9.1f}"
            f"{row['speedup']:>6.2f}x{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}"
            f"{row['gateway_cpu_ms_per_request']:>12.3f}{row['front_cpu_ms_per_request']:>14.3f}"
            f"{row['requests_per_gateway_cpu_s']:>11.1f}{row['gateway_cores_busy']:>7.2f}"
            f"{row['client_cpu_ms_per_request']:>15.3f}"
        )
    lines.append("")
    for mode, speedup in results["two_workers_speedup"].items():
        verdict = "met" if speedup >= SPEEDUP_GOAL else "not met"
        lines.append(f"{mode}: 2 workers {speedup:.2f}x one (goal >= {SPEEDUP_GOAL}x: {verdict})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--modes", default="plain,cumulative")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument(
        "--repeat", type=int, default=3, help="load runs per row; the median is shown"
    )
    parser.add_argument(
        "--route",
        choices=("direct", "front"),
        default="direct",
        help="send each session's turns to the base_url its token answer names (direct), or"
        " through the front's address (front)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the gateway commands and start nothing"
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    if args.dry_run:
        for mode in args.modes.split(","):
            for count in counts:
                line = command(count, mode, 0, "http://127.0.0.1:PORT", "SMOLLM2_TOKENIZER")
                print(" ".join(["rllm-core", *line[3:]]))
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
            *(sys.executable, "-m", "rllm_core.testing.fakeworker", "--port", str(worker_port)),
            *("--reply-ids", ",".join(map(str, reply_ids))),
        ],
        "fake worker on",
    )
    rows = []
    try:
        for mode in args.modes.split(","):
            for count in counts:
                rows.append(run(count, mode, f"http://127.0.0.1:{worker_port}", tokenizer, args))
    finally:
        worker.stop()
    speedups: dict[str, float] = {}
    for row in rows:
        one = next(r for r in rows if r["mode"] == row["mode"] and r["workers"] == counts[0])
        row["speedup"] = round(row["requests_per_s"] / one["requests_per_s"], 2)
        if row["workers"] == 2 and counts[0] == 1:
            speedups[row["mode"]] = row["speedup"]
    results = {
        "sessions": args.sessions,
        "turns": args.turns,
        "words": args.words,
        "repeat": args.repeat,
        "route": args.route,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average_before": [round(x, 2) for x in load_before],
        "rows": rows,
        "two_workers_speedup": speedups,
    }
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
