"""Storage on a local directory for rllm-core.

Components: the sample buffer ``file`` (:mod:`rllm_storage_file.buffer`), the object store
``file`` (:mod:`rllm_storage_file.objects`) and the logger ``jsonl``
(:mod:`rllm_storage_file.jsonl_logger`). The entry module is :mod:`rllm_storage_file.plugin`;
it imports only rllm-core, pydantic and the standard library.
"""
