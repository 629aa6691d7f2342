"""What ``plan check`` (and ``rllm-core sft``) refuses in a plan with an ``[sft]`` section.

An SFT plan trains on examples with a ``[trainer]`` and a ``[renderer]`` (and may have
``[[loggers]]`` and ``[run]``'s ``name``, ``seed``, ``output_dir``, ``save_every`` and
``deterministic``). The sections of RL runs would be accepted and not used, so each is an
error; so are data that do not exist, packing with a trainer backend that cannot pack
(the spec trait ``packs_sequences``) and an export with one that cannot export
(``exports_weights``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rllm_core.errors import PlanIssue
from rllm_core.plan.schema import Plan

__all__ = ["RL_SECTIONS", "RL_RUN_KEYS", "sft_issues"]

RL_SECTIONS = (
    "algorithm",
    "sampling",
    "rollout",
    "gateway",
    "scheduler",
    "harness",
    "tasks",
    "trace_store",
    "sampler",
    "sample_buffer",
    "object_store",
    "sandbox",
)
"""Sections only RL runs read."""

RL_RUN_KEYS = {
    "steps": "an SFT run's length is [sft].epochs over its examples",
    "pipeline": "an SFT run has no rollouts to pipeline",
    "eval_every": "an SFT run evaluates with [sft].eval_every",
    "eval_attempts": "an SFT run evaluates its eval data's loss, not attempts",
    "keep_best": "an SFT run keeps no best checkpoint",
    "export": "an SFT run exports with [sft].export",
}


def sft_issues(plan: Plan, components: Mapping[str, Any], path: str) -> list[PlanIssue]:
    """Every problem of ``plan``'s ``[sft]`` section and of the sections around it;
    ``components`` are the resolved ones (``"[trainer]"`` ...)."""
    sft = plan.sft
    issues: list[PlanIssue] = []

    def issue(section: str, key: str | None, value: Any, message: str, hint: str) -> None:
        issues.append(
            PlanIssue(path=path, section=section, key=key, value=value, message=message, hint=hint)
        )

    for section in RL_SECTIONS:
        if section in plan.model_fields_set:
            issue(
                section,
                None,
                None,
                f"[{section}] belongs to RL runs; `rllm-core sft` would not use it",
                f"remove [{section}] from the SFT plan (keep it in the RL plan that follows)",
            )
    for key, why in RL_RUN_KEYS.items():
        if key in plan.run.model_fields_set:
            issue("run", key, getattr(plan.run, key), why, f"remove [run].{key}")
    for where in ("trainer", "renderer"):
        if getattr(plan, where) is None:
            issue(where, "name", None, "an SFT run needs it", f"add a [{where}] section")
    if sft.data is None and sft.from_run is None:
        issue(
            "sft",
            "data",
            None,
            "no examples: set data (a chat JSONL file, a datasets file or a folder of them)"
            " or from_run (a run folder)",
            'add data = "train.jsonl" (relative to the plan)',
        )
    for key in ("data", "eval_data"):
        value = getattr(sft, key)
        if value is not None and not Path(value).exists():
            issue(
                "sft", key, value, "no such file or folder", "check the path (relative to the plan)"
            )
        elif (
            value is not None
            and _needs_datasets(Path(value), sft.format)
            and importlib.util.find_spec("datasets") is None
        ):
            issue(
                "sft",
                key,
                value,
                "reading it needs the `datasets` package, which is not installed",
                "pip install 'rllm-core[datasets]', or give a chat JSONL file",
            )
    if sft.from_run is not None:
        run = Path(sft.from_run)
        if not (run / "plan.resolved.json").is_file():
            issue(
                "sft",
                "from_run",
                sft.from_run,
                "not a run folder (no plan.resolved.json)",
                "name the folder `rllm-core run` printed",
            )
        elif not (run / "episodes.jsonl").is_file():
            issue(
                "sft",
                "from_run",
                sft.from_run,
                "the run scored no episode (no episodes.jsonl)",
                "name a run that finished at least one step",
            )
    trainer = components.get("[trainer]")
    if trainer is not None and sft.packing and not trainer.spec.trait("packs_sequences"):
        issue(
            "sft",
            "packing",
            True,
            f"trainer backend {trainer.name!r} cannot pack several examples into one row",
            "set packing = false (examples are padded instead)",
        )
    if trainer is not None and sft.export is not None and not trainer.spec.trait("exports_weights"):
        issue(
            "sft",
            "export",
            sft.export,
            f"trainer backend {trainer.name!r} cannot export its weights as a model folder",
            "remove [sft].export, or use a trainer backend that exports weights (torch)",
        )
    return issues


def _needs_datasets(path: Path, format: str) -> bool:
    if format == "chat-jsonl":
        return False
    if format == "datasets":
        return True
    files = [p for p in path.iterdir() if p.is_file()] if path.is_dir() else [path]
    return any(f.suffix in (".parquet", ".arrow", ".json") for f in files) or (
        not path.is_dir() and path.suffix != ".jsonl"
    )
