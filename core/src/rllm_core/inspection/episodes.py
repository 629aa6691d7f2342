"""The scored episodes of a run folder (``episodes.jsonl``): listing them and finding one by id.

A record is what :func:`rllm_core.run.metrics.episode_record` wrote: ``episode_id``,
``session_id``, ``task_id``, ``step``, ``reward``, ``termination``, ``signals``,
``completion_tokens`` and ``trajectories`` (each ``{lineage_id, trace_ids}``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rllm_core.inspection.errors import InspectionError
from rllm_core.run.folder import RunFolder

__all__ = ["episode_row", "find_episode", "read_episodes", "run_prefix", "turn_count"]

_SHOWN_MATCHES = 5


def read_episodes(folder: RunFolder) -> list[dict[str, Any]]:
    """Every episode record of ``folder`` in file order (a torn last line is skipped); a
    record written again by a resumed run replaces the earlier one. Raises
    :class:`InspectionError` when ``episodes.jsonl`` is missing."""
    if not folder.episodes.is_file():
        raise InspectionError(
            f"{folder.path} has no episodes.jsonl: the run scored no episode yet (it writes the"
            " file after its first step); check its progress with `rllm-core runs show"
            f" {folder.path}`"
        )
    records: dict[str, dict[str, Any]] = {}
    for row in RunFolder.read_jsonl(folder.episodes):
        if isinstance(row, dict) and isinstance(row.get("episode_id"), str):
            records.pop(row["episode_id"], None)
            records[row["episode_id"]] = row
    return list(records.values())


def turn_count(record: Mapping[str, Any]) -> int:
    """Model calls of the episode: trace ids over all its trajectories."""
    return sum(len(t.get("trace_ids", [])) for t in record.get("trajectories", []))


def episode_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--list`` row of one episode: ``episode_id``, ``step``, ``task_id``, ``reward``,
    ``termination``, ``turns`` and ``completion_tokens``."""
    return {
        "episode_id": record.get("episode_id"),
        "step": record.get("step"),
        "task_id": record.get("task_id"),
        "reward": record.get("reward"),
        "termination": record.get("termination"),
        "turns": turn_count(record),
        "completion_tokens": record.get("completion_tokens"),
    }


def run_prefix(records: Sequence[Mapping[str, Any]], folder: RunFolder) -> str:
    """What every episode id of the run starts with: ``<run id>-``, the run id being the
    folder's name when the run started (episode ids are ``<run id>-s<step>-<task>-<n>-a<try>``).
    Read from the ids themselves, so a renamed or copied folder still works; ``""`` when the
    ids do not have that shape."""
    ids = [str(r.get("episode_id", "")) for r in records]
    if not ids:
        return ""
    named = f"{folder.path.name}-"
    if all(i.startswith(named) for i in ids):
        return named
    first = records[0]
    cut = ids[0].find(f"-s{first.get('step')}-")
    prefix = ids[0][: cut + 1] if cut > 0 else ""
    return prefix if prefix and all(i.startswith(prefix) for i in ids) else ""


def find_episode(
    records: Sequence[Mapping[str, Any]], wanted: str, *, folder: RunFolder
) -> Mapping[str, Any]:
    """The record whose ``episode_id`` is ``wanted``, or else the only one it is a prefix of.

    Episode ids start with the run's id (see :func:`run_prefix`), so ``wanted`` may also leave
    that out: in ``quickstart-20261129-130041``, ``s1-arith-train-011-0`` finds
    ``quickstart-20261129-130041-s1-arith-train-011-0-a0``. Raises :class:`InspectionError`
    when nothing matches or several do.
    """
    for record in records:
        if record.get("episode_id") == wanted:
            return record
    prefixes = (wanted, f"{run_prefix(records, folder)}{wanted}")
    matches = [r for r in records if str(r.get("episode_id", "")).startswith(prefixes)]
    if len(matches) == 1:
        return matches[0]
    listing = f"`rllm-core traces show {folder.path} --list`"
    if not matches:
        raise InspectionError(
            f"no episode {wanted!r} in {folder.episodes} ({len(records)} episodes); list the ids"
            f" with {listing}"
        )
    shown = ", ".join(str(r.get("episode_id")) for r in matches[:_SHOWN_MATCHES])
    more = f" and {len(matches) - _SHOWN_MATCHES} more" if len(matches) > _SHOWN_MATCHES else ""
    raise InspectionError(
        f"episode {wanted!r} is ambiguous in {folder.episodes}: it starts {len(matches)} ids"
        f" ({shown}{more}); give more of the id (see {listing})"
    )
