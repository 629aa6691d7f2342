"""The OpenAI-compatible session gateway: HTTP layer, engine and token accumulator.

- :mod:`~rllm_core.gateway.server`: :class:`~rllm_core.gateway.server.Gateway`, served by
  uvicorn in this process (``rllm-core gateway serve`` runs it standalone).
- :mod:`~rllm_core.gateway.app`: the ASGI application (routes, auth, limits, errors).
- :mod:`~rllm_core.gateway.tokens`: session tokens, which reach one session's model routes.
- :mod:`~rllm_core.gateway.protocol`: the OpenAI wire format in and out.
- :mod:`~rllm_core.gateway.metrics`: event-loop lag, request counters and denials.
- :mod:`~rllm_core.gateway.serving`: uvicorn in a thread or on the caller's loop.
- :mod:`~rllm_core.gateway.shards`: several gateway processes behind a session-sharding front.
- :mod:`~rllm_core.gateway.engine` and :mod:`~rllm_core.gateway.accumulator`: chat requests to
  token ids and traces, cumulative token mode.

Nothing is imported here, so importing one module does not load the server stack.
"""
