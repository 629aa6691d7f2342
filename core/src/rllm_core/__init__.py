"""rllm-core: reinforcement-learning post-training for LLM agents.

The public API for plugin authors is re-exported here: ``hookimpl``, ``ComponentSpec``,
``lazy``, ``NoConfig``, ``PlanPath`` (marks a config key that holds a path) and ``Credential``
(a secret a component reads from the environment). Contracts live
in :mod:`rllm_core.ports`, shared records in :mod:`rllm_core.types`.
"""

from importlib.metadata import PackageNotFoundError, version

from rllm_core.plugins import ComponentSpec, Credential, NoConfig, PlanPath, hookimpl, lazy

try:
    __version__ = version("rllm-core")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0+unknown"

__all__ = ["ComponentSpec", "Credential", "NoConfig", "PlanPath", "__version__", "hookimpl", "lazy"]
