"""Convertible nodes in a real split run: `rllm-core run PLAN --role sampler` over two fake vLLM
servers (the vllm sampler's real pool), `rllm-core run PLAN --role trainer --node-class h100`
scheduling with the local-process launcher. When S1 starts the trainer, the node that may train
(not the spot one) is drained, its incarnation is launched with the node in its command file,
its server gets no completion while it is lent, the spot node keeps sampling, and after the
last step the node is returned with the newest release; every conversion is journaled. And the
sampler's half against the real pool, held deterministically: a completion still running on the
node after the grace is cut and answered by the other server."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rllm_core.testing.fakevllm import FakeVllmServer
from rllm_core.training.scheduler import SchedulerJournal
from rllm_object_store_file.objects import FileObjectStore

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_run_sampler

from test_run_sampler import arithmetic_reply, run_roles, write_plan

NAME = "served"


@pytest.fixture(scope="module")
def model_dir(tiny_smol_model_dir: Path) -> Path:
    return tiny_smol_model_dir


def nodes_plan(folder: Path, model_dir: Path, spot_url: str, gpu_url: str) -> Path:
    plan = write_plan(folder, model_dir, spot_url, steps=3)
    text = (
        plan.read_text()
        .replace(f'urls = ["{spot_url}"]', f'urls = ["{spot_url}", "{gpu_url}"]')
        .replace("steps = 3\n", 'steps = 3\npipeline = "async"\n')
        .replace("batch_size = 2\n", "batch_size = 2\nmax_policy_age = 1\n")
    )
    plan.write_text(
        text
        + f"""
[object_store]
name = "file"
root = "{folder / "store"}"

[scheduler]
poll_s = 0.1
idle_stop_s = 600
launcher = "local-process"
node_grace_s = 5

[scheduler.node_classes.h100]
capacity = 80

[scheduler.node_classes.spot]
spot = true

[[scheduler.nodes]]
name = "spot-0"
url = "{spot_url}"
class = "spot"

[[scheduler.nodes]]
name = "gpu-1"
url = "{gpu_url}"
class = "h100"
"""
    )
    return plan


def test_a_split_run_lends_its_trainable_node_to_the_trainer_and_gets_it_back(model_dir, tmp_path):
    arrivals: dict[str, list[float]] = {"spot-0": [], "gpu-1": []}

    def stamped(node: str):
        reply = arithmetic_reply(model_dir)

        def serve(prompt, max_tokens, stops):
            arrivals[node].append(time.time())
            return reply(prompt, max_tokens, stops)

        return serve

    with (
        FakeVllmServer(reply=stamped("spot-0")) as spot,
        FakeVllmServer(reply=stamped("gpu-1")) as gpu,
    ):
        plan = nodes_plan(tmp_path, model_dir, spot.url, gpu.url)
        run_roles(plan, tmp_path, trainer=["--node-class", "h100"])

    store = FileObjectStore(tmp_path / "store")
    records = SchedulerJournal(store, f"runs/{NAME}/scheduler").read()
    converted = [r for r in records if r["kind"] == "converted"]
    assert [(r["node"], r["to"], r["incarnation"]) for r in converted] == [
        ("gpu-1", "trainer", 1),
        ("gpu-1", "sampler", 1),
    ]
    assert converted[1]["trigger"] == "final" and converted[1]["release"] >= 1
    command_file = json.loads(store.get(f"runs/{NAME}/island/000001/command.json"))
    assert command_file["node"] == "gpu-1"

    def request(n: int) -> tuple[dict, dict]:
        key = f"runs/{NAME}/nodes/gpu-1/{n:06d}"
        return json.loads(store.get(key + ".ask")), json.loads(store.get(key + ".answer"))

    asks = [request(n) for n in range(1, 7)]
    assert [ask["op"] for ask, _ in asks] == ["drain", "collect", "cut", "release", "load", "admit"]
    assert not any("error" in answer for _, answer in asks)
    assert not store.exists(f"runs/{NAME}/nodes/spot-0/000001.ask"), "the spot node never converts"
    lent_from, lent_until = asks[1][1]["ts"], asks[5][0]["ts"]
    assert not [t for t in arrivals["gpu-1"] if lent_from < t < lent_until]
    assert [t for t in arrivals["spot-0"] if lent_from < t < lent_until], "spot-0 samples on"
    assert arrivals["gpu-1"] and min(arrivals["gpu-1"]) < lent_from, "gpu-1 sampled before"


def test_a_request_running_on_a_converting_node_is_cut_and_finishes_on_another(tmp_path):
    """The sampler's half against the vllm sampler's real pool: a completion held open on the
    node's server outlasts the grace, is cut, and its caller gets the other server's answer;
    the conversion counts it cut, and the node serves again once admitted."""
    import asyncio

    from rllm_core.routing import routed
    from rllm_core.storage.memory_objects import MemoryObjectStore
    from rllm_core.testing.fakeworker import fixed_reply
    from rllm_core.training.node_agent import NodeAgent, StoreNodeConverter
    from rllm_core.training.nodes import ConvertingTrainer, Node, NodeClass, NodePool
    from rllm_core.training.shared import SharedRun
    from rllm_core.types import SampleRequest, SamplingParams
    from rllm_sampler_vllm.pool import HttpWorkerPool
    from test_node_agent import Island

    params = SamplingParams(max_tokens=8, stop_token_ids=(2,))
    with (
        FakeVllmServer(reply=fixed_reply([11, 12])) as spot,
        FakeVllmServer(reply=fixed_reply([21, 22])) as gpu,
    ):

        async def scenario() -> tuple[list[int], list[int], Any]:
            # Listed first, gpu-1 takes a new session while both servers are idle.
            pool = HttpWorkerPool([gpu.url, spot.url], health_interval_s=0)
            shared = SharedRun(MemoryObjectStore(), NAME)
            converter = StoreNodeConverter(shared=shared, island=Island(), poll_s=0.02)

            async def load() -> int:
                return 3

            agent = NodeAgent(
                shared=shared,
                pool=pool,
                nodes={"spot-0": spot.url, "gpu-1": gpu.url},
                load_release=load,
                poll_s=0.02,
            )
            nodes = NodePool(
                nodes=[Node("spot-0", NodeClass("s", spot=True)), Node("gpu-1", NodeClass("h"))],
                converter=converter,
                grace_s=0.3,
                work=converter.work,
            )
            lifecycle = ConvertingTrainer(nodes)
            answering = asyncio.ensure_future(agent.run())
            try:
                gpu.hold()
                with routed("held"):
                    held = asyncio.ensure_future(
                        pool.sample(SampleRequest(prompt_token_ids=[1, 2], params=params))
                    )
                while pool.in_flight(gpu.url) == 0:
                    await asyncio.sleep(0.01)
                await lifecycle.start(1)
                served = (await held).completion_token_ids[:-1]
                gpu.release()
                await lifecycle.stop("scheduled")
                with routed("after"):
                    again = await pool.sample(SampleRequest(prompt_token_ids=[1], params=params))
                return served, again.completion_token_ids[:-1], nodes.conversions
            finally:
                answering.cancel()
                await asyncio.gather(answering, return_exceptions=True)
                await pool.aclose()

        served, again, conversions = asyncio.run(scenario())
    assert served == [11, 12], "the cut request was answered by the spot node"
    assert [(c.node, c.to, c.kept, c.cut) for c in conversions] == [
        ("gpu-1", "trainer", 0, 1),
        ("gpu-1", "sampler", 0, 0),
    ]
    assert again == [21, 22], "the node serves its session again once admitted"
