"""The session-sharding ring of ``gateway serve --workers`` and the weight version route."""

from __future__ import annotations

from collections import Counter

from rllm_core.gateway.shards import ShardFront, ShardRing
from rllm_core.testing.samplers import ScriptedSampler


def test_the_ring_is_stable_balanced_and_moves_few_sessions_when_a_worker_is_added():
    ids = [f"run-s{step}-task-{n}-a{a}" for step in range(5) for n in range(100) for a in range(4)]
    two, three = ShardRing(2), ShardRing(3)
    assert [two.owner(i) for i in ids] == [ShardRing(2).owner(i) for i in ids]
    counts = Counter(two.owner(i) for i in ids)
    assert min(counts.values()) > 0.35 * len(ids)
    moved = sum(two.owner(i) != three.owner(i) for i in ids)
    assert moved < 0.5 * len(ids)
    assert {ShardRing(1).owner(i) for i in ids} == {0}


def test_weight_version_sets_the_samplers_version_and_refuses_a_bad_body(serve, raw, toy):
    sampler = ScriptedSampler(["a"], renderer=toy)
    http = raw(serve(sampler))
    assert http("POST", "/weight_version", {"version": 4}).status == 200
    assert sampler.weight_version == 4
    assert http("GET", "/metrics").json()["weight_version"] == 4
    bad = http("POST", "/weight_version", {"version": -1})
    assert (bad.status, bad.error["param"]) == (400, "version")
    assert http("GET", "/weight_version").status == 405


def test_a_sessions_direct_url_is_its_owners_port_under_the_clients_host_name():
    front = ShardFront(["http://127.0.0.1:9001", "http://127.0.0.1:9002"])
    sid = "run-s0-task-3-a1"
    port = 9001 + front.owner(sid)
    assert front.session_url(sid) == f"http://127.0.0.1:{port}/sessions/{sid}/v1"
    assert front.session_url(sid, "gw.lan:8000") == f"http://gw.lan:{port}/sessions/{sid}/v1"
    assert front.session_url(sid, "[::1]") == f"http://[::1]:{port}/sessions/{sid}/v1"
    assert front.session_url(sid, "10.0.0.5") == f"http://10.0.0.5:{port}/sessions/{sid}/v1"
