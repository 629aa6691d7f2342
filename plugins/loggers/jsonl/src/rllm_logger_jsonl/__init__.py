"""A JSON-lines metrics logger for rllm-core.

The entry module is :mod:`rllm_logger_jsonl.plugin`.
"""
