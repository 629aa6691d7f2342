"""open_client: one TLS context for every client a run opens."""

from __future__ import annotations

from rllm_core.kit import chat as module
from rllm_core.types import LLMEndpoint


def test_clients_share_one_tls_context():
    endpoint = LLMEndpoint(base_url="https://models.example/v1", api_key="k", model="m")
    first = module.open_client(endpoint, timeout_s=5.0, max_retries=0)
    second = module.open_client(endpoint, timeout_s=5.0, max_retries=0)
    assert first._client is not second._client
    assert module._tls_context() is module._tls_context()
    pools = [c._client._transport._pool for c in (first, second)]
    assert pools[0]._ssl_context is pools[1]._ssl_context is module._tls_context()
