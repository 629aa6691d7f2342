"""Which first-party distribution provides which component.

Used only to tell a user what to install when a plan names a component no installed plugin
provides. It lists names, never imports anything.
"""

from __future__ import annotations

from rllm_core.plugins.specs import Kind, canonical_name

__all__ = ["FIRST_PARTY", "known_provider"]

FIRST_PARTY: dict[Kind, dict[str, str]] = {
    Kind.LOSS: {
        "ppo-clip": "rllm-loss-ppo",
        "cispo": "rllm-loss-ppo",
        "gspo": "rllm-loss-ppo",
        "reinforce": "rllm-loss-ppo",
        "dppo-tv": "rllm-loss-dppo",
        "dppo-kl": "rllm-loss-dppo",
        "echo": "rllm-loss-echo",
    },
    Kind.ADVANTAGE_ESTIMATOR: {
        "grpo": "rllm-loss-ppo",
        "rloo": "rllm-loss-ppo",
        "reinforce": "rllm-loss-ppo",
        "reinforce-plus-plus-baseline": "rllm-loss-ppo",
        "prpo": "rllm-loss-ppo",
    },
    Kind.RENDERER: {
        "chatml": "rllm-renderer-chatml",
        "qwen3": "rllm-renderer-qwen3",
        "hf": "rllm-renderer-hf",
    },
    Kind.SANDBOX_BACKEND: {
        "local": "rllm-sandbox-local",
        "modal": "rllm-sandbox-modal",
        "daytona": "rllm-sandbox-daytona",
    },
    Kind.TRAINER_BACKEND: {
        "torch": "rllm-backend-torch",
        "tinker": "rllm-backend-tinker",
        "fireworks": "rllm-backend-fireworks",
    },
    Kind.HARNESS: {
        "single-turn": "rllm-harness-single-turn",
        "shell": "rllm-harness-shell",
        "cli": "rllm-harness-cli",
    },
    Kind.TASK_SOURCE: {
        "harbor": "rllm-tasks-harbor",
        "jsonl": "rllm-tasks-jsonl",
    },
    Kind.TRACE_STORE: {
        "deltachain": "rllm-storage-deltachain",
        "memory": "rllm-storage-deltachain",
    },
    Kind.SAMPLE_BUFFER: {
        "file": "rllm-storage-file",
        "s3": "rllm-storage-s3",
    },
    Kind.OBJECT_STORE: {
        "file": "rllm-storage-file",
        "s3": "rllm-storage-s3",
    },
    Kind.LOGGER: {
        "jsonl": "rllm-storage-file",
        "tensorboard": "rllm-logger-tensorboard",
        "wandb": "rllm-logger-wandb",
        "mlflow": "rllm-logger-mlflow",
    },
}


def known_provider(kind: Kind, name: str) -> str | None:
    """The first-party distribution that provides ``kind:name``, if any."""
    return FIRST_PARTY.get(kind, {}).get(canonical_name(name))
