"""Building blocks shared by storage plugins: checksummed record framing
(:mod:`rllm_core.storage.framing`), crash-safe filesystem steps
(:mod:`rllm_core.storage.durable`) and the object key rules (:mod:`rllm_core.storage.keys`)."""
