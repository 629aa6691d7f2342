"""MLflow logger for rllm-core.

Component: the logger ``mlflow`` (:mod:`rllm_logger_mlflow.logger`). The entry module is
:mod:`rllm_logger_mlflow.plugin`; it imports only rllm-core, pydantic and the standard library,
so mlflow loads when a plan builds the logger.
"""
