"""TensorBoard logger for rllm-core.

Component: the logger ``tensorboard`` (:mod:`rllm_logger_tensorboard.logger`). The entry module
is :mod:`rllm_logger_tensorboard.plugin`; it imports only rllm-core, pydantic and the standard
library, so tensorboard loads when a plan builds the logger.
"""
