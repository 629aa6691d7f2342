"""PPO-family policy losses for rllm-core.

The entry module is :mod:`rllm_loss_ppo.plugin`; it imports neither torch nor numpy. The
implementations load when a plan selects them.
"""
