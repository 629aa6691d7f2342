"""A crash-safe sample buffer for rllm-core.

The entry module is :mod:`rllm_sample_buffer_file.plugin`.
"""
