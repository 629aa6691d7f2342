"""What a run folder says about its run: status, progress, rewards, tokens, checkpoints,
components and plots (``rllm-core runs show`` and ``runs list``).

Everything is read from the files the run writes (see :mod:`rllm_core.run.folder`);
nothing is built and no plugin is loaded, so a folder can be inspected while its run is going
and on a machine without the run's plugins.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rllm_core.inspection.errors import InspectionError
from rllm_core.run.checkpoints import checkpoint_steps as run_checkpoint_steps
from rllm_core.run.folder import RunFolder
from rllm_core.run.metrics import sft_summary, summarize

__all__ = [
    "RUNNING_OR_CRASHED",
    "SUMMARY_WINDOW",
    "checkpoint_steps",
    "component_of",
    "list_runs",
    "open_run_folder",
    "run_report",
]

RUNNING_OR_CRASHED = "running-or-crashed"
"""The status of a folder without ``summary.json``: its run is still going, or it died without
writing one (killed with SIGKILL, out of memory, machine lost)."""

SUMMARY_WINDOW = 5
"""Steps averaged for the first and last reward (the same window as ``summary.json``)."""

_PLOTS = ("reward", "loss")


def open_run_folder(path: str | Path) -> RunFolder:
    """The run folder at ``path``; raises :class:`InspectionError` when ``path`` is missing or
    holds no readable ``plan.resolved.json``."""
    folder = RunFolder(path)
    if not folder.path.is_dir():
        raise InspectionError(
            f"{str(path)!r} does not exist; pass a run folder (`rllm-core runs list` shows them)"
        )
    if not folder.resolved_plan.is_file():
        raise InspectionError(
            f"{str(path)!r} is not a run folder (it has no plan.resolved.json); pass the folder"
            " `rllm-core run` printed when the run started (`rllm-core runs list` shows them)"
        )
    try:
        data = folder.read_resolved()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InspectionError(
            f"{folder.resolved_plan} cannot be read ({exc}); the run folder is damaged, restore"
            " plan.resolved.json or start the run again"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("components"), list):
        raise InspectionError(
            f"{folder.resolved_plan} is not a resolved plan (no components list); the run folder"
            " is damaged, restore plan.resolved.json or start the run again"
        )
    return folder


def component_of(resolved: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The component entry of ``plan.resolved.json`` at ``where`` (``[trace_store]``), or None."""
    for component in resolved.get("components", []):
        if isinstance(component, dict) and component.get("where") == where:
            return component
    return None


def checkpoint_steps(folder: RunFolder) -> list[int]:
    """Steps of the run's complete checkpoints, ascending (cuts being written are left out;
    see :mod:`rllm_core.run.checkpoints`)."""
    return run_checkpoint_steps(folder.checkpoints)


def _read_summary(folder: RunFolder) -> dict[str, Any] | None:
    """``summary.json``, or None when it is missing or unreadable (a run killed while writing
    it never leaves half a file, but a copied folder might)."""
    try:
        data = json.loads(folder.summary.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _short(component: Mapping[str, Any] | None, *keys: str) -> dict[str, Any] | None:
    if component is None:
        return None
    config = component.get("config") or {}
    out: dict[str, Any] = {"name": component.get("name"), "provider": component.get("provider")}
    for key in keys:
        if config.get(key) is not None:
            out[key] = config[key]
    return out


def _components(resolved: Mapping[str, Any]) -> dict[str, Any]:
    aux = [
        {"name": c.get("name"), "coef": c.get("coef"), "provider": c.get("provider")}
        for c in resolved.get("components", [])
        if isinstance(c, dict) and str(c.get("where", "")).startswith("[algorithm].aux_losses")
    ]
    return {
        "trainer": _short(component_of(resolved, "[trainer]"), "model", "base_model"),
        "loss": _short(component_of(resolved, "[algorithm].loss")),
        "aux_losses": aux,
        "advantage": _short(component_of(resolved, "[algorithm].advantage")),
        "renderer": _short(component_of(resolved, "[renderer]")),
        "harness": _short(component_of(resolved, "[harness]")),
        "tasks": _short(component_of(resolved, "[tasks]"), "path"),
        "sandbox": _short(component_of(resolved, "[sandbox]")),
        "trace_store": _short(component_of(resolved, "[trace_store]"), "path"),
    }


def _best(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[float | None, int | None]:
    best: tuple[float | None, int | None] = (None, None)
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and (best[0] is None or value > best[0]):
            best = (float(value), int(row["step"]))
    return best


def _last_activity(folder: RunFolder) -> float | None:
    times = [
        p.stat().st_mtime
        for p in (folder.metrics, folder.episodes, folder.summary, folder.resolved_plan)
        if p.is_file()
    ]
    return max(times) if times else None


def _plot(folder: RunFolder, name: str) -> str | None:
    path = folder.path / f"{name}.png"
    return str(path) if path.is_file() else None


def _iso(when: float | None) -> str | None:
    if when is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def run_report(path: str | Path) -> dict[str, Any]:
    """One JSON-ready object describing the run folder at ``path``.

    Keys: ``run_dir``, ``name``, ``status`` (``summary.json``'s ``finished`` /
    ``interrupted`` / ``failed``, or :data:`RUNNING_OR_CRASHED` without it), ``has_summary``,
    ``steps_done``, ``steps_planned``, ``wall_s`` (``summary.json``'s, else the sum of the
    steps' ``time/step_s``) with ``wall_source`` (``summary`` or ``metrics``), ``started`` and
    ``last_activity`` (local times), ``reward`` (``first`` and ``last``: means of the first and
    last ``window`` steps; ``best`` and ``best_step``: the best step's mean), ``accuracy``
    (``last``, ``best``, ``best_step``), ``episodes``, ``infra_failures``, ``tokens``
    (``sampled``, ``trained``), ``checkpoints`` (step numbers), ``components`` (trainer,
    loss, aux_losses, advantage, renderer, harness, tasks, sandbox, trace_store; each with
    ``name`` and ``provider``, the trainer with ``model``, tasks and trace store with
    ``path``; None when the plan selects none), ``plots`` (``reward``/``loss`` to the file,
    or None) and ``sft`` (an SFT run's NLL figures, see :func:`_sft_report`, its reward
    figures being None; None for an RL run). Numbers are None where no step finished. Raises
    :class:`InspectionError` when ``path`` is not a run folder.
    """
    folder = open_run_folder(path)
    resolved = folder.read_resolved()
    rows = [r for r in RunFolder.read_jsonl(folder.metrics) if isinstance(r, dict) and "step" in r]
    summary = _read_summary(folder)
    sft = "sft" in resolved.get("plan", {})
    if sft:
        totals = _sft_totals(rows)
        planned = summary.get("total_steps") if summary is not None else None
    else:
        totals = summarize(rows, window=SUMMARY_WINDOW)
        planned = resolved.get("plan", {}).get("run", {}).get("steps")
    done = max((int(r["step"]) for r in rows), default=0)
    if summary is not None and isinstance(summary.get("last_step"), int):
        done = summary["last_step"]
    if summary is not None and isinstance(summary.get("wall_s"), (int, float)):
        wall, wall_source = float(summary["wall_s"]), "summary"
    elif rows:
        wall = sum(float(r.get("time/step_s", 0.0)) for r in rows)
        wall_source = "metrics"
    else:
        wall, wall_source = None, None
    best_reward, best_reward_step = _best(rows, "reward/mean")
    best_accuracy, best_accuracy_step = _best(rows, "accuracy")
    return {
        "run_dir": str(folder.path),
        "name": folder.path.name,
        "status": str(summary.get("status", RUNNING_OR_CRASHED)) if summary else RUNNING_OR_CRASHED,
        "has_summary": summary is not None,
        "steps_done": done,
        "steps_planned": planned,
        "wall_s": wall,
        "wall_source": wall_source,
        "started": _iso(folder.resolved_plan.stat().st_mtime),
        "last_activity": _iso(_last_activity(folder)),
        "reward": {
            "window": min(SUMMARY_WINDOW, len(rows)),
            "first": totals["reward_first"],
            "last": totals["reward_last"],
            "best": best_reward,
            "best_step": best_reward_step,
        },
        "accuracy": {
            "last": totals["accuracy_last"],
            "best": best_accuracy,
            "best_step": best_accuracy_step,
        },
        "episodes": int(totals["episodes"]),
        "infra_failures": int(totals["infra_failures"]),
        "tokens": {
            "sampled": int(totals["tokens_sampled"]),
            "trained": int(totals["tokens_trained"]),
        },
        "checkpoints": checkpoint_steps(folder),
        "components": _components(resolved),
        "plots": {name: _plot(folder, name) for name in _PLOTS},
        "sft": _sft_report(rows, summary) if sft else None,
    }


def _sft_totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An SFT run's lines in the shape of :func:`summarize` (it has no rewards or episodes)."""
    trained = sum(float(r.get("train/tokens", 0.0)) for r in rows)
    return {
        "reward_first": None,
        "reward_last": None,
        "accuracy_last": None,
        "episodes": 0,
        "infra_failures": 0,
        "tokens_sampled": 0,
        "tokens_trained": trained,
    }


def _sft_report(
    rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``nll_first`` / ``nll_last`` (means of the first and last steps' train NLL),
    ``eval_nll`` (the last scored), ``examples`` and ``eval_examples`` (from summary.json)."""
    totals = sft_summary(rows, window=SUMMARY_WINDOW)
    return {
        "window": min(SUMMARY_WINDOW, len(rows)),
        "nll_first": totals["nll_first"],
        "nll_last": totals["nll_last"],
        "eval_nll": totals["eval_nll"],
        "examples": summary.get("examples") if summary else None,
        "eval_examples": summary.get("eval_examples") if summary else None,
    }


def list_runs(directory: str | Path) -> list[dict[str, Any]]:
    """A short record of every run folder directly inside ``directory``, newest first (by when
    ``plan.resolved.json`` was written): ``run_dir``, ``name``, ``status``, ``steps_done``,
    ``steps_planned``, ``reward_last``, ``started``. Folders that are not run folders are
    skipped. Raises :class:`InspectionError` when ``directory`` is not a directory."""
    root = Path(directory)
    if not root.is_dir():
        raise InspectionError(
            f"{str(directory)!r} is not a directory; pass the folder runs are written to"
            " ([run].output_dir of the plan, `runs` by default)"
        )
    found: list[tuple[float, dict[str, Any]]] = []
    for child in root.iterdir():
        if not (child / "plan.resolved.json").is_file():
            continue
        try:
            report = run_report(child)
        except InspectionError:
            continue
        started = (child / "plan.resolved.json").stat().st_mtime
        found.append(
            (
                started,
                {
                    "run_dir": report["run_dir"],
                    "name": report["name"],
                    "status": report["status"],
                    "steps_done": report["steps_done"],
                    "steps_planned": report["steps_planned"],
                    "reward_last": report["reward"]["last"],
                    "started": report["started"],
                },
            )
        )
    found.sort(key=lambda item: (item[0], item[1]["name"]), reverse=True)
    return [record for _, record in found]
