"""The local trainer backend of rllm-core: one transformers model, trained with LoRA or in full,
and served to the gateway by a batched sampler on the same weights.

The entry module is :mod:`rllm_trainer_backend_torch.plugin`; it imports neither torch nor
transformers. The backend (:mod:`rllm_trainer_backend_torch.backend`) loads them when a plan
builds it.
"""
