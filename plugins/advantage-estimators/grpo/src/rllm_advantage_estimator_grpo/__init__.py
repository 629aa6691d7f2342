"""GRPO-family advantage estimators for rllm-core: group-relative, leave-one-out and batch
baselines.

The entry module is :mod:`rllm_advantage_estimator_grpo.plugin`; the estimators are pure Python.
"""
