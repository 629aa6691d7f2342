"""Building blocks shared by storage plugins: checksummed record framing
(:mod:`rllm_core.storage.framing`) and crash-safe filesystem steps
(:mod:`rllm_core.storage.durable`)."""
