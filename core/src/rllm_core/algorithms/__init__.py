"""Algorithm building blocks shared by trainer backends and loss plugins.

Submodules are imported explicitly (``from rllm_core.algorithms.aggregation import
make_aggregate``); this package imports none of them, so ``import rllm_core`` stays light.
"""
