"""What the pages of ``rllm-core view`` show, as JSON-ready objects, read through the same
readers as ``rllm-core runs`` and ``rllm-core traces`` (:mod:`rllm_core.inspection`).

Runs are named by their folder's name inside the directory being viewed (or, when one run
folder is viewed, by that folder's name). Every read goes to the files again, so a run still
writing shows what it wrote so far; what is costly to read again is cached until its files
change (their size and modification time): run reports, the episode index and the renderer.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rllm_core.inspection import InspectionError
from rllm_core.inspection.conversation import (
    history_break,
    open_renderer,
    open_trace_store,
    read_traces,
    turn_view,
)
from rllm_core.inspection.episodes import episode_row, find_episode, read_episodes, run_prefix
from rllm_core.inspection.runs import open_run_folder, run_report
from rllm_core.run.folder import RunFolder

__all__ = ["MAX_PAGE", "NotFound", "RunsView"]

MAX_PAGE = 500
"""The most episodes one page of the episode list holds."""

_CURVE_PREFIXES = ("reward/", "train/", "eval/", "offpolicy/", "async/", "tokens/", "time/")


class NotFound(InspectionError):
    """A run, episode or call the request names does not exist."""


def _stamp(*paths: Path) -> tuple[tuple[int, int], ...]:
    """Size and modification time of each path (zeros when missing): a cached read of them is
    still good while this is unchanged."""
    out = []
    for path in paths:
        try:
            info = path.stat()
        except OSError:
            out.append((0, 0))
        else:
            out.append((info.st_size, info.st_mtime_ns))
    return tuple(out)


class _Cache:
    """Values computed from files, kept while the files' :func:`_stamp` is unchanged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[Any, tuple[Any, Any]] = {}

    def get(self, key: Any, stamp: Any, compute: Callable[[], Any]) -> Any:
        with self._lock:
            held = self._values.get(key)
        if held is not None and held[0] == stamp:
            return held[1]
        value = compute()
        with self._lock:
            self._values[key] = (stamp, value)
        return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class RunsView:
    """The run folders under ``path``: a directory of run folders, or one run folder.

    Raises :class:`InspectionError` when ``path`` is neither.
    """

    def __init__(self, path: str | Path) -> None:
        root = Path(path)
        if (root / "plan.resolved.json").is_file():
            open_run_folder(root)
            self.root, self.single = root.parent, root.name
        elif root.is_dir():
            self.root, self.single = root, None
        else:
            raise InspectionError(
                f"{str(path)!r} is neither a run folder nor a directory; pass the folder runs"
                " are written to ([run].output_dir of the plan, `runs` by default) or one run"
                " folder"
            )
        self._cache = _Cache()

    # ---------------------------------------------------------------- runs

    def _names(self) -> list[str]:
        if self.single is not None:
            return [self.single]
        return sorted(
            child.name for child in self.root.iterdir() if (child / "plan.resolved.json").is_file()
        )

    def folder(self, name: str) -> RunFolder:
        """The run folder called ``name``; :class:`NotFound` when there is none."""
        if name not in self._names():
            raise NotFound(f"no run folder {name!r} in {self.root}; the runs list names them")
        return open_run_folder(self.root / name)

    def _report(self, name: str) -> dict[str, Any]:
        folder = RunFolder(self.root / name)
        stamp = _stamp(
            folder.resolved_plan,
            folder.metrics,
            folder.summary,
            folder.episodes,
            folder.checkpoints,
        )
        return self._cache.get(("report", name), stamp, lambda: run_report(folder.path))

    def runs(self) -> dict[str, Any]:
        """``runs``: every run's ``runs show`` report (see
        :func:`rllm_core.inspection.runs.run_report`), newest first; folders that cannot be
        read are listed under ``unreadable`` with the reason."""
        reports, unreadable = [], []
        for name in self._names():
            try:
                reports.append(self._report(name))
            except InspectionError as exc:
                unreadable.append({"name": name, "error": str(exc)})
        reports.sort(key=lambda r: (r["started"] or "", r["name"]), reverse=True)
        return {"root": str(self.root), "runs": reports, "unreadable": unreadable}

    def run(self, name: str) -> dict[str, Any]:
        """One run: its report, the resolved plan and the last value of every ``eval/`` metric
        with its step."""
        folder = self.folder(name)
        report = dict(self._report(name))
        report["plan"] = folder.read_resolved()
        evals: dict[str, dict[str, Any]] = {}
        for row in self._metric_rows(folder):
            for key, value in row.items():
                if key.startswith("eval/") and _number(value) is not None:
                    evals[key] = {"value": _number(value), "step": row["step"]}
        report["eval"] = evals
        return report

    def _metric_rows(self, folder: RunFolder) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            rows = RunFolder.read_jsonl(folder.metrics)
            return [r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)]

        return self._cache.get(("metrics", folder.path.name), _stamp(folder.metrics), read)

    def metrics(self, name: str) -> dict[str, Any]:
        """The run's ``metrics.jsonl`` as columns: ``steps`` and ``series`` (every numeric key
        to its value per step, ``null`` where a step lacks it), ``keys`` in a reading order
        (reward, train, eval, offpolicy, async, tokens, time, then the rest)."""
        rows = self._metric_rows(self.folder(name))
        keys: dict[str, None] = {}
        for row in rows:
            for key, value in row.items():
                if key != "step" and _number(value) is not None:
                    keys.setdefault(key)

        def order(key: str) -> tuple[int, str]:
            for rank, prefix in enumerate(_CURVE_PREFIXES):
                if key.startswith(prefix):
                    return rank, key
            return len(_CURVE_PREFIXES), key

        ordered = sorted(keys, key=order)
        return {
            "run": name,
            "steps": [row["step"] for row in rows],
            "keys": ordered,
            "series": {key: [_number(row.get(key)) for row in rows] for key in ordered},
        }

    # ---------------------------------------------------------------- episodes

    def _episodes(self, folder: RunFolder) -> dict[str, Any]:
        def index() -> dict[str, Any]:
            records = read_episodes(folder)
            rows = []
            for record in records:
                row = episode_row(record)
                row["group_id"] = record.get("group_id")
                row["truncated"] = record.get("truncated")
                rows.append(row)
            return {
                "records": records,
                "rows": rows,
                "by_id": {r["episode_id"]: i for i, r in enumerate(rows)},
                "prefix": run_prefix(records, folder),
                "facets": _facets(rows),
            }

        return self._cache.get(("episodes", folder.path.name), _stamp(folder.episodes), index)

    def episodes(self, name: str, query: Mapping[str, str]) -> dict[str, Any]:
        """One page of the run's episodes (``traces show --list`` rows with ``group_id``),
        filtered by ``step``, ``task`` (a part of the task id), ``termination``, ``group``,
        ``min_reward`` and ``max_reward``, from ``offset`` (0) for ``limit`` (100, at most
        :data:`MAX_PAGE`) rows. Also ``total`` (all episodes), ``matched`` (after the
        filters), ``prefix`` (what every id starts with) and ``facets``: the steps, task ids,
        terminations and the number of groups, for the filter controls."""
        index = self._episodes(self.folder(name))
        rows: list[dict[str, Any]] = index["rows"]
        step = _int(query, "step")
        offset = max(0, _int(query, "offset") or 0)
        limit = min(MAX_PAGE, max(1, _int(query, "limit") or 100))
        low, high = _float(query, "min_reward"), _float(query, "max_reward")
        task, ending, group = query.get("task"), query.get("termination"), query.get("group")

        def keep(row: dict[str, Any]) -> bool:
            reward = _number(row["reward"])
            return (
                (step is None or row["step"] == step)
                and (not task or task in str(row["task_id"]))
                and (not ending or row["termination"] == ending)
                and (not group or row["group_id"] == group)
                and (low is None or (reward is not None and reward >= low))
                and (high is None or (reward is not None and reward <= high))
            )

        filtering = step is not None or task or ending or group or low is not None
        filtered = [row for row in rows if keep(row)] if filtering or high is not None else rows
        return {
            "run": name,
            "total": len(rows),
            "matched": len(filtered),
            "offset": offset,
            "limit": limit,
            "prefix": index["prefix"],
            "rows": filtered[offset : offset + limit],
            "facets": index["facets"],
        }

    def _record(self, name: str, episode_id: str) -> tuple[RunFolder, Mapping[str, Any]]:
        folder = self.folder(name)
        index = self._episodes(folder)
        at = index["by_id"].get(episode_id)
        if at is not None:
            return folder, index["records"][at]
        try:
            return folder, find_episode(index["records"], episode_id, folder=folder)
        except InspectionError as exc:
            raise NotFound(str(exc)) from exc

    def _renderer(self, folder: RunFolder) -> Any:
        return self._cache.get(
            ("renderer", folder.path.name),
            _stamp(folder.resolved_plan),
            lambda: open_renderer(folder),
        )

    def _traces(self, folder: RunFolder, record: Mapping[str, Any]) -> list[Any]:
        store = open_trace_store(folder)
        try:
            return read_traces(store, record, folder=folder)
        finally:
            store.close()

    def episode(self, name: str, episode_id: str) -> dict[str, Any]:
        """One episode as ``traces show --episode --json`` gives it: ``episode`` (its record)
        and ``turns`` (each call's :func:`~rllm_core.inspection.conversation.turn_view` with
        ``history_break`` and ``marker``, the reset line ``traces show`` prints, or None), and
        ``warning`` when calls stored without messages could not be decoded."""
        from rllm_core.cli.traces_cmd import reset_marker

        folder, record = self._record(name, episode_id)
        refs = self._traces(folder, record)
        renderer, warning = None, None
        if any(t is not None and not t.record.messages_delta for _, _, t in refs):
            try:
                renderer = self._renderer(folder)
            except InspectionError as exc:
                warning = f"calls stored without messages stay undecoded: {exc}"
        turns = []
        for ref in refs:
            view = turn_view(ref, renderer=renderer)
            if not view["missing"]:
                view["history_break"] = history_break(ref[2])
            view["marker"] = reset_marker(view)
            turns.append(view)
        return {"run": name, "episode": dict(record), "turns": turns, "warning": warning}

    def tokens(self, name: str, episode_id: str, call: int) -> dict[str, Any]:
        """The tokens of the episode's call number ``call`` (its index in ``turns``): what the
        call added to the prompt (observation, not trained on) then what the model sampled
        (action), each token with ``id``, ``text`` (:func:`token_texts`, by the run's renderer),
        ``logprob`` (actions only) and ``action``. Also ``prefix_tokens`` (the prompt the call
        inherited from its parents), ``reset_reason`` and ``history_break``."""
        folder, record = self._record(name, episode_id)
        refs = self._traces(folder, record)
        if not 0 <= call < len(refs):
            raise NotFound(
                f"episode {record.get('episode_id')!r} has {len(refs)} calls; call {call} is"
                " not one of them"
            )
        lineage, trace_id, trace = refs[call]
        if trace is None:
            raise NotFound(f"trace {trace_id} of lineage {lineage} is not in the trace store")
        renderer = self._renderer(folder)
        rec = trace.record
        decode = renderer.decode
        prompt = rec.prompt_delta_token_ids
        tokens = [
            {"id": i, "text": text, "action": False}
            for i, text in zip(prompt, token_texts(decode, prompt), strict=True)
        ]
        completion = rec.completion_token_ids
        for position, (i, text) in enumerate(
            zip(completion, token_texts(decode, completion), strict=True)
        ):
            logprob = rec.logprobs[position] if position < len(rec.logprobs) else None
            tokens.append({"id": i, "text": text, "action": True, "logprob": logprob})
        return {
            "run": name,
            "episode_id": record.get("episode_id"),
            "call": call,
            "lineage_id": lineage,
            "trace_id": trace_id,
            "turn": rec.turn,
            "prefix_tokens": len(trace.prompt_token_ids) - len(rec.prompt_delta_token_ids),
            "reset_reason": rec.reset_reason,
            "history_break": history_break(trace),
            "tokens": tokens,
        }


def _facets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sorted({r["step"] for r in rows if isinstance(r["step"], int)})
    return {
        "steps": steps,
        "tasks": sorted({str(r["task_id"]) for r in rows})[:MAX_PAGE],
        "terminations": sorted({str(r["termination"]) for r in rows}),
        "groups": len({r["group_id"] for r in rows}),
    }


def _int(query: Mapping[str, str], key: str) -> int | None:
    value = query.get(key)
    if value in (None, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise InspectionError(f"{key}={value!r} is not a whole number") from None


def _float(query: Mapping[str, str], key: str) -> float | None:
    value = query.get(key)
    if value in (None, ""):
        return None
    try:
        return float(str(value))
    except ValueError:
        raise InspectionError(f"{key}={value!r} is not a number") from None


def token_texts(decode: Callable[[list[int]], str], ids: Sequence[int]) -> list[str]:
    """The text of each token of ``ids``: decoded alone, except that a character whose UTF-8
    bytes span several tokens goes whole to the token that completes it and the tokens before
    it get ``""`` (decoded alone, each would show U+FFFD). A run of up to four tokens that
    never completes a character is shown as decoded."""
    texts: list[str] = []
    pending: list[int] = []
    for token in ids:
        pending.append(token)
        text = decode(pending)
        if text.endswith("\ufffd") and len(pending) < 4:
            texts.append("")
            continue
        texts.append(text)
        pending = []
    return texts
