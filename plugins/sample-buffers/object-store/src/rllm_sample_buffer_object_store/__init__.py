"""rllm-sample-buffer-object-store: the ``sample_buffer:object-store`` plugin for rllm-core."""
