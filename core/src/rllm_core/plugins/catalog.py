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
        "reinforce-kl": "rllm-loss-ppo",
        "dppo-tv": "rllm-loss-dppo",
        "dppo-kl": "rllm-loss-dppo",
        "echo": "rllm-loss-echo",
    },
    Kind.ADVANTAGE_ESTIMATOR: {
        "grpo": "rllm-advantage-estimator-grpo",
        "rloo": "rllm-advantage-estimator-grpo",
        "reinforce": "rllm-advantage-estimator-grpo",
        "reinforce-plus-plus-baseline": "rllm-advantage-estimator-grpo",
        "prpo": "rllm-advantage-estimator-grpo",
        "distill": "rllm-advantage-estimator-grpo",
    },
    Kind.RENDERER: {
        "chatml": "rllm-renderer-chatml",
        "qwen3": "rllm-renderer-chatml",
        "hf": "rllm-renderer-hf",
    },
    Kind.SANDBOX_BACKEND: {
        "local": "rllm-sandbox-backend-local",
        "modal": "rllm-sandbox-backend-modal",
        "daytona": "rllm-sandbox-backend-daytona",
    },
    Kind.TRAINER_BACKEND: {
        "torch": "rllm-trainer-backend-torch",
        "tinker": "rllm-trainer-backend-tinker",
        "fireworks": "rllm-trainer-backend-fireworks",
    },
    Kind.HARNESS: {
        "single-turn": "rllm-harness-single-turn",
        "shell": "rllm-harness-shell",
        "cli": "rllm-harness-cli",
        "mini-swe-agent": "rllm-harness-mini-swe-agent",
        "terminus-2": "rllm-harness-terminus-2",
    },
    Kind.TASK_SOURCE: {
        "datasets": "rllm-task-source-datasets",
        "harbor": "rllm-task-source-harbor",
        "jsonl": "rllm-task-source-jsonl",
    },
    Kind.TRACE_STORE: {
        "deltachain": "rllm-trace-store-deltachain",
        "memory": "rllm-trace-store-deltachain",
    },
    Kind.SAMPLE_BUFFER: {
        "file": "rllm-sample-buffer-file",
        "object-store": "rllm-sample-buffer-object-store",
    },
    Kind.OBJECT_STORE: {
        "file": "rllm-object-store-file",
        "s3": "rllm-object-store-s3",
    },
    Kind.LOGGER: {
        "jsonl": "rllm-logger-jsonl",
        "tensorboard": "rllm-logger-tensorboard",
        "wandb": "rllm-logger-wandb",
        "mlflow": "rllm-logger-mlflow",
    },
    Kind.SAMPLER: {
        "vllm": "rllm-sampler-vllm",
    },
    Kind.TRAINER_LAUNCHER: {
        "modal": "rllm-sandbox-backend-modal",
    },
}


def known_provider(kind: Kind, name: str) -> str | None:
    """The first-party distribution that provides ``kind:name``, if any."""
    return FIRST_PARTY.get(kind, {}).get(canonical_name(name))
