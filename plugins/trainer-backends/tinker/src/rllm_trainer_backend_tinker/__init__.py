"""The Tinker trainer backend of rllm-core: LoRA training and sampling on Tinker's hosted
models, with rllm-core's loss plugins: in Tinker's own loss kernels when a loss has one, else
computed on the client.

The entry module is :mod:`rllm_trainer_backend_tinker.plugin`; it imports neither the Tinker SDK nor
torch. The backend (:mod:`rllm_trainer_backend_tinker.backend`) loads them when a plan builds it.
"""
