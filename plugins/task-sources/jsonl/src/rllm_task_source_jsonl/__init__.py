"""The ``jsonl`` task source for rllm-core: question/answer tasks from JSON-lines files."""
