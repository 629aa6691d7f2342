"""Weights & Biases logger for rllm-core.

Component: the logger ``wandb`` (:mod:`rllm_logger_wandb.logger`). The entry module is
:mod:`rllm_logger_wandb.plugin`; it imports only rllm-core, pydantic and the standard library,
so wandb loads when a plan builds the logger.
"""
