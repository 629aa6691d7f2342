"""Divergence PPO policy losses for rllm-core.

The entry module is :mod:`rllm_loss_dppo.plugin`; it does not import torch. The losses load
when a plan selects them.
"""
