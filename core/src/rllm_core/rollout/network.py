"""The network an episode's sandbox gets, and the endpoint its agent uses from inside.

A harness may declare ``sandbox_network`` (see :class:`~rllm_core.ports.agents.Harness`): the
network its in-sandbox programs need. The sandbox gets the wider of that and the task's own
``environment.network``; with ``GATEWAY`` the spec names the session's URL, and the agent is
handed the URL at which the sandbox reaches it.
"""

from __future__ import annotations

import msgspec

from rllm_core.errors import SandboxError
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import LLMEndpoint, NetworkPolicy, SandboxSpec

__all__ = ["agent_endpoint", "harness_network", "sandbox_spec"]


def harness_network(harness: object) -> NetworkPolicy:
    """The network ``harness`` declares through ``sandbox_network`` (``NONE`` when it
    declares none)."""
    declared = getattr(harness, "sandbox_network", None)
    return NetworkPolicy.NONE if declared is None else NetworkPolicy(declared)


def sandbox_spec(spec: SandboxSpec, harness: object, llm: LLMEndpoint) -> SandboxSpec:
    """``spec`` with the network the episode needs: the wider of the task's and the
    harness's, and, when that is ``GATEWAY``, ``gateway_url`` set to ``llm.base_url``."""
    network = max(spec.network, harness_network(harness), key=lambda policy: policy.rank)
    if network is NetworkPolicy.GATEWAY:
        return msgspec.structs.replace(spec, network=network, gateway_url=llm.base_url)
    if network is not spec.network:
        return msgspec.structs.replace(spec, network=network)
    return spec


def agent_endpoint(spec: SandboxSpec, sandbox: Sandbox | None, llm: LLMEndpoint) -> LLMEndpoint:
    """``llm`` as the programs in ``sandbox`` (created from ``spec``) reach it: with
    ``GATEWAY``, the sandbox's ``gateway_url``; otherwise ``llm`` unchanged."""
    if sandbox is None or spec.network is not NetworkPolicy.GATEWAY or spec.gateway_url is None:
        return llm
    inside = getattr(sandbox, "gateway_url", None)
    if not inside:
        raise SandboxError(
            f"the {type(sandbox).__name__} created with network = 'gateway' has no gateway_url;"
            " its backend does not implement the gateway network: use network = 'full' for"
            " this backend or another sandbox backend"
        )
    return msgspec.structs.replace(llm, base_url=inside)
