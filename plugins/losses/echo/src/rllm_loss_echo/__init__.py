"""The ECHO auxiliary loss for rllm-core.

The entry module is :mod:`rllm_loss_echo.plugin`; it does not import torch. The loss loads
when a plan selects it.
"""
