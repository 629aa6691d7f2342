"""The ``datasets`` task source for rllm-core."""
