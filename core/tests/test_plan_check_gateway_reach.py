"""``plan check`` refuses a loopback ``[gateway].host`` when the harness calls the gateway from
inside its sandboxes and the sandbox backend runs them on another machine (trait ``remote``):
every episode would fail to reach the model. A local backend, a harness that calls from this
process, or a reachable host pass."""

from __future__ import annotations

from typing import Any

import pytest
from rllm_core.errors import PlanError
from rllm_core.plan.load import parse_plan
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plugins import PluginManager


def resolve(sandbox: str, harness: dict[str, Any], host: str = "127.0.0.1"):
    data = {
        "algorithm": {"loss": "ppo-clip", "advantage": "grpo"},
        "trainer": {"name": "torch", "model": "smollm2-135m-instruct"},
        "sandbox": {"name": sandbox},
        "harness": harness,
        "gateway": {"host": host},
    }
    return resolve_plan(parse_plan(data), manager=PluginManager(), path="plan.toml")


CLI = {"name": "cli", "invocation": "agent"}


@pytest.mark.parametrize("sandbox", ["modal", "daytona"])
@pytest.mark.parametrize("network", ["gateway", "full"])
def test_a_remote_sandbox_calling_a_loopback_gateway_is_refused(sandbox, network):
    pytest.importorskip(f"rllm_sandbox_backend_{sandbox}")
    with pytest.raises(PlanError) as caught:
        resolve(sandbox, CLI | {"network": network})
    (issue,) = caught.value.issues
    assert (issue.section, issue.key, issue.value) == ("gateway", "host", "127.0.0.1")
    assert f"sandbox backend {sandbox!r} runs them on another machine" in issue.message
    assert f"network = {network!r}" in issue.message
    assert issue.hint.startswith("set [gateway] host to an address of this machine")


def test_what_can_reach_the_gateway_passes():
    pytest.importorskip("rllm_sandbox_backend_modal")
    resolve("modal", CLI, host="10.0.0.5")
    resolve("modal", {"name": "shell"})
    resolve("local", CLI)
