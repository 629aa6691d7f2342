"""Trace stores for rllm-core.

Components: the trace store ``deltachain`` (:mod:`rllm_trace_store_deltachain.store`,
append-only compressed segment files) and the trace store ``memory``
(:mod:`rllm_trace_store_deltachain.memory`).
The entry module is :mod:`rllm_trace_store_deltachain.plugin`; it imports only rllm-core, pydantic
and the standard library.
"""
