"""Building blocks shared by storage plugins: checksummed record framing
(:mod:`rllm_core.storage.framing`), crash-safe filesystem steps
(:mod:`rllm_core.storage.durable`) and the object key rules (:mod:`rllm_core.storage.keys`); the
in-memory sample buffer and object store (:mod:`~rllm_core.storage.memory_buffer`,
:mod:`~rllm_core.storage.memory_objects`). The sample buffer in an object store is the plugin
``sample_buffer:object-store``."""
