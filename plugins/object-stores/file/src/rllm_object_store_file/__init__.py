"""An object store on a local directory for rllm-core.

The entry module is :mod:`rllm_object_store_file.plugin`.
"""
