"""`rllm-core run` with `[gateway] workers = 2` over the fake vLLM server: the run's sessions are
served by two gateway processes, each following the policy after every optimizer step, and
every trace comes home to the run's trace store."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from reference.cli_process import run_folder
from rllm_core.gateway.shards import ShardRing
from rllm_core.rollout.sessions import SessionKey
from rllm_core.testing.fakevllm import FakeVllmServer

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_run_sampler

from test_run_sampler import (
    arithmetic_reply,
    assert_each_step_sampled_the_previous_policy,
    run,
    write_plan,
)


@pytest.fixture(scope="module")
def model_dir(tiny_smol_model_dir: Path) -> Path:
    return tiny_smol_model_dir


def with_workers(plan: Path, workers: int) -> Path:
    plan.write_text(plan.read_text() + f"\n[gateway]\nworkers = {workers}\n")
    return plan


def two_workers(pool: Any, tokenizer_dir: Path, store: Any, **options: Any) -> Any:
    """Two gateway workers over ``pool``'s servers with the chatml renderer, recording into
    ``store``."""
    from rllm_core.rollout.gateway_workers import Component, open_gateway_workers

    return open_gateway_workers(
        2,
        renderer=Component("chatml", {"tokenizer": str(tokenizer_dir)}),
        sampler=pool,
        sampler_name="vllm",
        store=store,
        **options,
    )


@pytest.mark.parametrize("rank", [4, 0], ids=["lora", "full"])
def test_two_gateway_workers_serve_the_run_on_the_policy_of_every_step(model_dir, tmp_path, rank):
    with FakeVllmServer(reply=arithmetic_reply(model_dir)) as server:
        plan = with_workers(write_plan(tmp_path, model_dir, server.url, rank=rank), 2)
        result = run(plan, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "served")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["weight_version"] for m in metrics] == [1.0, 2.0, 3.0]
    assert all(m["trained"] == 1.0 for m in metrics)
    # Each worker's client sent step k's calls with the policy after step k - 1.
    assert_each_step_sampled_the_previous_policy(run_dir, server)
    # Each step's line says how many calls each worker served: both served, between them
    # every completion the server answered, each exactly the calls of the sessions the ring
    # gives it.
    ring = ShardRing(2)
    for step, line in enumerate(metrics, start=1):
        by_worker = Counter()
        for session, calls in _calls(run_dir, step).items():
            by_worker[ring.owner(session)] += calls
        assert {k: v for k, v in line.items() if k.startswith("gateway/calls/")} == {
            "gateway/calls/0": float(by_worker[0]),
            "gateway/calls/1": float(by_worker[1]),
        }
    totals = [sum(m[f"gateway/calls/{i}"] for m in metrics) for i in (0, 1)]
    assert all(totals), totals
    assert sum(totals) == len(server.completions)


def _calls(run_dir: Path, step: int) -> dict[str, int]:
    """The model calls recorded for each session of ``step``."""
    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    store = DeltaChainTraceStore(run_dir / "traces")
    try:
        return {
            session: len(store.chain(session))
            for session in store.sessions()
            if (key := SessionKey.parse(session, run=run_dir.name)) and key.step == step
        }
    finally:
        store.close()


OPEN_WORKERS = """
import asyncio, sys
from rllm_core.rollout.gateway_workers import Component, open_gateway_workers
from rllm_trace_store_deltachain.memory import MemoryTraceStore
from rllm_sampler_vllm.pool import HttpWorkerPool


async def main():
    pool = HttpWorkerPool([sys.argv[1]])
    async with open_gateway_workers(
        2, renderer=Component("chatml", {"tokenizer": sys.argv[2]}), sampler=pool,
        sampler_name="vllm", store=MemoryTraceStore(),
    ) as (sessions, url):
        print(" ".join(str(p.pid) for p in sessions.processes.processes), flush=True)
        await asyncio.sleep(600)


asyncio.run(main())
"""


def test_the_workers_exit_once_the_process_that_started_them_is_gone(smollm2_tokenizer_dir):
    import os
    import signal
    import subprocess
    import time

    with FakeVllmServer() as server:
        parent = subprocess.Popen(
            [sys.executable, "-c", OPEN_WORKERS, server.url, str(smollm2_tokenizer_dir)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert parent.stdout is not None
            pids = [int(pid) for pid in parent.stdout.readline().split()]
            assert len(pids) == 2, pids
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait(10)
            deadline = time.monotonic() + 15
            alive = pids
            while alive and time.monotonic() < deadline:
                time.sleep(0.1)
                alive = [pid for pid in pids if _alive(pid)]
            assert alive == [], f"gateway workers {alive} outlived the run's process"
        finally:
            parent.kill()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A worker that exited but is not yet reaped by init shows as a zombie.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def test_a_session_lives_on_its_worker_until_released_and_a_dead_worker_is_named(
    smollm2_tokenizer_dir,
):
    import asyncio
    import os
    import signal

    import httpx
    import openai
    from rllm_core.rollout.gateway_workers import GatewayWorkerError
    from rllm_core.types import SamplingParams
    from rllm_sampler_vllm.pool import HttpWorkerPool
    from rllm_trace_store_deltachain.memory import MemoryTraceStore

    store = MemoryTraceStore()

    async def scenario(server: FakeVllmServer) -> None:
        pool = HttpWorkerPool([server.url])
        async with two_workers(pool, smollm2_tokenizer_dir, store) as (sessions, _):
            ids = [f"s-{n}" for n in range(16)]
            sid = next(s for s in ids if sessions.ring.owner(s) == 1)
            sessions.configure_session(sid, enforced=SamplingParams(max_tokens=3, seed=5))
            endpoint = sessions.endpoint(sid)
            assert endpoint.base_url == f"{sessions.urls[1]}/sessions/{sid}/v1"
            agent = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
            reply = await asyncio.to_thread(
                agent.chat.completions.create,
                model="policy",
                messages=[{"role": "user", "content": "hi"}],
            )
            assert reply.choices[0].message is not None
            (sent,) = server.requests
            assert (sent["seed"], sent["max_tokens"]) == (5, 3)
            # Reading the session brings its records home; releasing takes them from the worker.
            (trace,) = sessions.traces.session(sid)
            assert store.chain(sid) == [trace.record]
            sessions.release_session(sid)
            admin = {"authorization": f"Bearer {sessions.processes.env['RLLM_GATEWAY_TOKEN']}"}
            left = httpx.get(f"{sessions.urls[1]}/sessions/{sid}/traces", headers=admin)
            assert left.status_code == 404
            assert [t.record for t in store.session(sid)] == [trace.record]
            with pytest.raises(openai.AuthenticationError):
                agent.with_options(max_retries=0).chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "again"}]
                )
            # A worker that died is named with its exit status; the other one serves on.
            victim = sessions.processes.processes[0]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            doomed = next(s for s in ids if sessions.ring.owner(s) == 0)
            with pytest.raises(GatewayWorkerError) as caught:
                sessions.configure_session(doomed, enforced=None)
            message = str(caught.value)
            assert "gateway worker 0" in message and "exited with status -9" in message
            assert f"/sessions/{doomed}/configure" in message
            other = next(s for s in ids if sessions.ring.owner(s) == 1 and s != sid)
            sessions.configure_session(other, enforced=None)
        await pool.aclose()

    with FakeVllmServer() as server:
        asyncio.run(scenario(server))


def test_an_async_run_evaluating_on_two_workers_brings_every_trace_home(model_dir, tmp_path):
    with FakeVllmServer(reply=arithmetic_reply(model_dir)) as server:
        plan = write_plan(tmp_path, model_dir, server.url)
        plan.write_text(
            plan.read_text()
            .replace("steps = 3\n", 'steps = 3\npipeline = "async"\neval_every = 3\n')
            .replace("batch_size = 2\n", "batch_size = 2\nmax_policy_age = 1\n")
        )
        result = run(with_workers(plan, 2), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "served")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "eval/pass@1" in metrics[-1]
    # Training batches and the evaluation's sessions alike: every completion the server
    # answered has its trace in the run's store, and no worker kept one.
    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    store = DeltaChainTraceStore(run_dir / "traces")
    try:
        sessions = store.sessions()
        traced = sum(len(store.chain(s)) for s in sessions)
    finally:
        store.close()
    assert traced == len(server.completions)
    evaluated = [s for s in sessions if SessionKey.parse(s, run=run_dir.name) is None]
    assert evaluated, sessions


def test_a_hung_worker_stalls_one_admin_call_and_fails_the_next_at_once(smollm2_tokenizer_dir):
    import asyncio
    import os
    import signal
    import time

    from rllm_core.rollout.gateway_workers import GatewayWorkerError
    from rllm_sampler_vllm.pool import HttpWorkerPool
    from rllm_trace_store_deltachain.memory import MemoryTraceStore

    async def scenario(server: FakeVllmServer) -> None:
        pool = HttpWorkerPool([server.url])
        async with two_workers(
            pool, smollm2_tokenizer_dir, MemoryTraceStore(), admin_timeout_s=1.0
        ) as (sessions, _):
            ids = [f"s-{n}" for n in range(16)]
            on_hung = [s for s in ids if sessions.ring.owner(s) == 0]
            elsewhere = next(s for s in ids if sessions.ring.owner(s) == 1)
            hung = sessions.processes.processes[0]
            os.kill(hung.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(GatewayWorkerError) as caught:
                    sessions.configure_session(on_hung[0], enforced=None)
                assert 1.0 <= time.monotonic() - started < 5.0
                message = str(caught.value)
                assert f"gateway worker 0 ({sessions.urls[0]}, pid {hung.pid})" in message
                assert f"did not answer POST /sessions/{on_hung[0]}/configure within 1s" in message
                started = time.monotonic()
                with pytest.raises(GatewayWorkerError) as caught:
                    sessions.endpoint(on_hung[1])
                assert time.monotonic() - started < 0.5
                message = str(caught.value)
                assert f"stopped answering (POST /sessions/{on_hung[0]}/configure" in message
                assert f"/sessions/{on_hung[1]}/token was not sent" in message
                # The other worker serves on.
                sessions.configure_session(elsewhere, enforced=None)
                assert sessions.served()[0] is None
            finally:
                os.kill(hung.pid, signal.SIGCONT)
        await pool.aclose()

    with FakeVllmServer() as server:
        asyncio.run(scenario(server))
