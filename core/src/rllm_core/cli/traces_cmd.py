"""``rllm-core traces``: one episode's conversation from a run's trace store, turn by turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.text import Text

from rllm_core.cli.output import (
    EXIT_USAGE,
    Column,
    console,
    err_console,
    fail,
    is_plain,
    print_heading,
    print_json,
    print_table,
)
from rllm_core.cli.runs_cmd import number

ROLE_STYLE = {
    "system": "magenta",
    "user": "cyan",
    "assistant": "green",
    "tool": "yellow",
}


@click.group()
def traces() -> None:
    """The traces a run recorded: every model call with its tokens."""


@traces.command("show")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--episode",
    "episode_id",
    metavar="ID",
    help="The episode to show: its id, a unique prefix, or either without the run's prefix.",
)
@click.option("--list", "list_episodes", is_flag=True, help="List the run's episodes instead.")
@click.option(
    "--raw",
    is_flag=True,
    help="Also show each call's tokens decoded by the run's renderer (template included).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def show(path: Path, episode_id: str | None, list_episodes: bool, raw: bool, as_json: bool) -> None:
    """Print one episode of the run folder PATH turn by turn, or list its episodes.

    Per model call: the messages (role and content), prompt tokens (the full prompt and what
    the call added), completion tokens, the completion's mean logprob and finish reason; all
    counts come from the stored token ids. A call that starts a new root after a reset (the
    agent truncated, summarized or edited its history, or changed its tools) is preceded by a
    marker line with the reason and, for a history break, where it happened; --json gives each
    call's ``reset_reason`` and ``history_break`` (its ``reason``, ``at``, ``kept``,
    ``dropped``, ``inserted`` and ``source``, or null). A run still going reads too: its trace
    store is opened read-only (no lock, nothing written) and shows what was stored so far. Exit
    2 when PATH is not a run folder, it has no episodes.jsonl, the episode is unknown or the
    trace store is missing.
    """
    from rllm_core.inspection import InspectionError
    from rllm_core.inspection.episodes import read_episodes
    from rllm_core.inspection.runs import open_run_folder

    if list_episodes == (episode_id is not None):
        fail(
            f"pass either --episode ID or --list (e.g. `rllm-core traces show {path} --list`)",
            EXIT_USAGE,
        )
    try:
        folder = open_run_folder(path)
        records = read_episodes(folder)
        if list_episodes:
            _list(folder, records, as_json)
        else:
            _episode(folder, records, str(episode_id), raw=raw, as_json=as_json)
    except InspectionError as exc:
        fail(str(exc), EXIT_USAGE)


def _list(folder: Any, records: list[dict[str, Any]], as_json: bool) -> None:
    from rllm_core.inspection.episodes import episode_row, run_prefix

    rows = [episode_row(r) for r in records]
    if as_json:
        print_json(rows)
        return
    prefix = run_prefix(records, folder)
    title = f"{len(rows)} episodes of {folder.path}"
    if prefix:
        title += f" (ids shown without {prefix!r}; --episode takes either)"
    columns = [
        Column("Episode", fold=True),
        Column("Step", justify="right"),
        Column("Task", fold=True),
        Column("Reward", justify="right"),
        Column("Turns", justify="right"),
        Column("End"),
    ]
    cells = [
        [
            str(row["episode_id"]).removeprefix(prefix),
            str(row["step"]),
            str(row["task_id"]),
            number(row["reward"]),
            str(row["turns"]),
            str(row["termination"]),
        ]
        for row in rows
    ]
    print_table(title, columns, cells)


def _episode(
    folder: Any, records: list[dict[str, Any]], wanted: str, *, raw: bool, as_json: bool
) -> None:
    from rllm_core.inspection import InspectionError
    from rllm_core.inspection.conversation import (
        open_renderer,
        open_trace_store,
        read_traces,
        turn_view,
    )
    from rllm_core.inspection.episodes import find_episode

    record = find_episode(records, wanted, folder=folder)
    store = open_trace_store(folder)
    try:
        refs = read_traces(store, record, folder=folder)
    finally:
        store.close()
    renderer = None
    unlabelled = any(t is not None and not t.record.messages_delta for _, _, t in refs)
    if raw or unlabelled:
        try:
            renderer = open_renderer(folder)
        except InspectionError as exc:
            if raw:
                raise
            err_console.print(
                f"warning: calls stored without messages stay undecoded: {exc}", markup=False
            )
    turns = [_with_break(turn_view(ref, renderer=renderer), ref[2]) for ref in refs]
    if as_json:
        print_json({"episode": record, "turns": turns})
        return
    _print_header(record, turns)
    for view in turns:
        _print_turn(view, raw=raw)


def _with_break(view: dict[str, Any], trace: Any) -> dict[str, Any]:
    """``view`` with ``history_break`` (see
    :func:`rllm_core.inspection.conversation.history_break`) when the trace is present."""
    from rllm_core.inspection.conversation import history_break

    if trace is not None:
        view["history_break"] = history_break(trace)
    return view


def reset_marker(view: dict[str, Any]) -> str | None:
    """The line shown before a call that reset its lineage, e.g. ``── reset at turn 3:
    history_summarized (4 messages replaced by a 1-message summary, 3 kept) ──``; ``None``
    for a call that did not."""
    from rllm_core.gateway.history import HistoryBreak

    reason = view.get("reset_reason")
    if view.get("missing") or not reason:
        return None
    found = view.get("history_break")
    what = HistoryBreak(**found).describe() if found else str(reason)
    if found and found.get("source") is not None:
        where = f"new lineage {view['lineage_id']} at turn {view['turn']}"
    else:
        where = f"reset at turn {view['turn']}"
    return f"── {where}: {what} ──"


def _print_header(record: dict[str, Any], turns: list[dict[str, Any]]) -> None:
    signals = ", ".join(f"{k}={v:g}" for k, v in sorted(record.get("signals", {}).items()))
    present = [t for t in turns if not t["missing"]]
    completion = sum(t["completion_tokens"] for t in present)
    prompt = max((t["prompt_tokens"] for t in present), default=0)
    count = len(record.get("trajectories", []))
    lines = [
        ("episode", str(record.get("episode_id"))),
        ("task", f"{record.get('task_id')} · step {record.get('step')}"),
        (
            "reward",
            f"{number(record.get('reward'))} · termination {record.get('termination')}"
            + (f" · {signals}" if signals else ""),
        ),
        (
            "calls",
            f"{len(turns)} in {count} trajector{'y' if count == 1 else 'ies'} · {completion:,}"
            f" completion tokens · longest prompt {prompt:,} tokens",
        ),
        ("session", str(record.get("session_id"))),
    ]
    print_table(
        None, [Column(style="bold"), Column(fold=True)], lines, show_header=False, boxed=False
    )


def _stats(view: dict[str, Any]) -> Text:
    text = Text(
        f"prompt {view['prompt_tokens']:,} tokens (+{view['prompt_delta_tokens']:,} new)"
        f" · completion {view['completion_tokens']:,} tokens"
        f" · mean logprob {number(view['mean_logprob'])}"
        f" · finish {view['finish_reason']} · policy v{view['weight_version']}",
        style="dim",
    )
    if not view["chain_complete"]:
        text.append(" · prompt incomplete (an ancestor trace is missing)", style="bold red")
    return text


def _message_text(message: dict[str, Any]) -> Text:
    text = Text()
    if message.get("reasoning"):
        text.append(f"(thinking) {message['reasoning']}\n", style="dim italic")
    text.append(str(message.get("content", "")))
    for call in message.get("tool_calls", []):
        text.append(f"\n→ {call.get('name')}({call.get('arguments', '')})", style="bold")
    if message.get("tool_call_id"):
        text.append(f"\n(answers {message['tool_call_id']})", style="dim")
    return text


def _print_turn(view: dict[str, Any], *, raw: bool) -> None:
    title = f"{view['lineage_id']} · "
    plain = is_plain()
    if not plain:
        console.print()
    marker = reset_marker(view)
    if marker is not None:
        console.print(Text(marker, style="bold yellow"), soft_wrap=plain)
    if view["missing"]:
        print_heading(title + "missing trace", style="red")
        console.print(
            Text(f"trace {view['trace_id']} is not in the trace store", style="bold red"),
            soft_wrap=plain,
        )
        return
    print_heading(title + f"turn {view['turn']}")
    console.print(_stats(view), soft_wrap=plain)
    rows: list[list[Text]] = []
    for message in view["messages"]:
        role = str(message.get("role", "?"))
        rows.append([Text(role, style=ROLE_STYLE.get(role, "bold")), _message_text(message)])
    text = view.get("text")
    if text is not None and (raw or not view["messages"]):
        rows.append([Text("prompt +", style="dim"), Text(text["prompt_delta"])])
        rows.append([Text("sampled", style="dim"), Text(text["completion"])])
    elif not view["messages"]:
        rows.append([Text("tokens", style="dim"), Text("(stored without messages)", style="dim")])
    # As wide as "assistant" in every turn, so that the turns line up.
    roles = Column(min_width=9)
    print_table(None, [roles, Column(fold=True)], rows, show_header=False, boxed=False)
