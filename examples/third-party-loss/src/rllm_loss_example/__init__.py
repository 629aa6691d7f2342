"""An rllm-core loss plugin: ``reinforce-tis``, REINFORCE with truncated importance weights."""
