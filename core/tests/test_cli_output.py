"""The table helper every command prints through: whole words on a terminal of any width,
tab-separated lines when piped, the environment's say over which."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from rich.console import Console
from rich.text import Text
from rllm_core.cli.output import OUTPUT_ENV, Column, print_heading, print_table
from rllm_core.cli.plan_cmd import settings_rows
from rllm_core.plan.schema import Plan

ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RULES = set("─━│┃┏┓┗┛┡┩╇╈┳┻┼")

# The longest names the first-party plugins have, in the shape `plugins` prints them.
PLUGINS = [
    ["rllm-advantage-estimator-grpo", "0.1.0", "active", ["grpo", "reinforce-plus-plus-baseline"]],
    ["rllm-trainer-backend-fireworks", "0.1.0", "active", ["trainer_backend:fireworks"]],
    ["rllm-sandbox-backend-daytona", "0.1.0", "conflict", ["sandbox_backend:daytona"]],
]
NAMES = {
    "rllm-advantage-estimator-grpo",
    "rllm-trainer-backend-fireworks",
    "rllm-sandbox-backend-daytona",
    "reinforce-plus-plus-baseline",
    "trainer_backend:fireworks",
    "sandbox_backend:daytona",
}


@pytest.fixture(autouse=True)
def _auto(monkeypatch):
    monkeypatch.delenv(OUTPUT_ENV, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)


def terminal(width: int) -> tuple[Console, StringIO]:
    stream = StringIO()
    return Console(file=stream, width=width, force_terminal=True), stream


def piped() -> tuple[Console, StringIO]:
    stream = StringIO()
    return Console(file=stream, width=80, force_terminal=False), stream


def whole_words(text: str) -> set[str]:
    """Every space-separated word of ``text``'s lines, rules and commas stripped."""
    return {w.strip(",") for line in text.splitlines() for w in re.split(r"[\s│┃]+", line) if w}


def plugins_table(target: Console) -> None:
    print_table(
        "rllm-core plugins",
        [Column("Plugin"), Column("Version"), Column("Status"), Column("Provides")],
        PLUGINS,
        target=target,
    )


@pytest.mark.parametrize(
    ("width", "form"), [(100, "ruled"), (80, "unruled"), (60, "stacked"), (40, "stacked")]
)
def test_a_terminal_table_never_breaks_a_name(width, form):
    out, stream = terminal(width)
    plugins_table(out)
    text = ESCAPE.sub("", stream.getvalue())
    assert all(len(line) <= width for line in text.splitlines()), text
    assert whole_words(text) >= NAMES, text
    shapes = {
        "ruled": r"^┃ Plugin +┃ Version ┃",
        "unruled": r"^Plugin +Version  Status    Provides",
        "stacked": r"^Plugin +rllm-advantage-estimator-grpo",
    }
    assert re.search(shapes[form], text, re.M), text


def test_rich_alone_would_break_those_names_at_80_columns():
    from rich.table import Table

    out, stream = terminal(80)
    table = Table()
    for header in ("Plugin", "Version", "Status", "Provides"):
        table.add_column(header)
    for *cells, provides in PLUGINS:
        table.add_row(*cells, "\n".join(provides))
    out.print(table)
    assert not whole_words(ESCAPE.sub("", stream.getvalue())) >= NAMES


def test_a_path_longer_than_its_column_folds_and_a_shorter_one_stays_whole():
    long = "/data/" + "/".join(f"segment-{i:02d}" for i in range(12)) + "/tokenizer.json"
    short = "/data/tokenizer.json"
    out, stream = terminal(80)
    print_table(
        None,
        [Column("Name"), Column("Path", fold=True)],
        [["long", long], ["short", short]],
        target=out,
    )
    lines = ESCAPE.sub("", stream.getvalue()).splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any(short in line for line in lines)
    assert not any(long in line for line in lines)
    pieces = [line.split("│")[2].strip() for line in lines if line.startswith("│")]
    assert long in "".join(pieces)


def test_a_key_value_table_has_no_rules_and_keeps_its_labels():
    out, stream = terminal(80)
    rows = [("trace store", "deltachain · path runs/x/traces"), ("plots", ["a.png", "b.png"])]
    print_table(None, [Column(style="bold"), Column(fold=True)], rows, show_header=False,
                boxed=False, target=out)  # fmt: skip
    text = ESCAPE.sub("", stream.getvalue())
    assert not set(text) & RULES
    assert [line.rstrip() for line in text.splitlines()] == [
        "trace store  deltachain · path runs/x/traces",
        "plots        a.png",
        "             b.png",
    ]


def test_piped_tables_are_one_tab_separated_line_per_row():
    out, stream = piped()
    plugins_table(out)
    print_table(
        None,
        [Column("key"), Column("value")],
        [("message", Text("two\nlines\tand a tab", style="red")), ("none", None)],
        show_header=False,
        target=out,
    )
    print_heading("a heading", target=out)
    assert stream.getvalue().splitlines() == [
        "# rllm-core plugins",
        "Plugin\tVersion\tStatus\tProvides",
        "rllm-advantage-estimator-grpo\t0.1.0\tactive\tgrpo; reinforce-plus-plus-baseline",
        "rllm-trainer-backend-fireworks\t0.1.0\tactive\ttrainer_backend:fireworks",
        "rllm-sandbox-backend-daytona\t0.1.0\tconflict\tsandbox_backend:daytona",
        "message\ttwo\\nlines\\tand a tab",
        "none\t",
        "# a heading",
    ]


def test_the_environment_picks_the_form(monkeypatch):
    monkeypatch.setenv(OUTPUT_ENV, "plain")
    out, stream = terminal(80)
    plugins_table(out)
    assert stream.getvalue().splitlines()[1] == "Plugin\tVersion\tStatus\tProvides"

    monkeypatch.setenv(OUTPUT_ENV, "rich")
    out, stream = piped()
    plugins_table(out)
    assert re.search(r"^Plugin +Version +Status", stream.getvalue(), re.M)
    assert "\t" not in stream.getvalue() and "\x1b[" not in stream.getvalue()

    monkeypatch.setenv(OUTPUT_ENV, "fancy")
    with pytest.raises(SystemExit) as exited:
        plugins_table(out)
    assert exited.value.code == 2


def test_no_color_keeps_the_table_and_drops_the_colours(monkeypatch):
    out, stream = terminal(80)
    print_table(None, ["Status"], [[Text("error", style="bold red")]], target=out)
    assert "\x1b[" in stream.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    out, stream = terminal(80)
    print_table(None, ["Status"], [[Text("error", style="red")]], target=out)
    assert "\x1b[31m" not in stream.getvalue()
    assert "┃ Status" in ESCAPE.sub("", stream.getvalue())


def test_a_row_of_the_wrong_length_is_refused():
    out, _ = piped()
    with pytest.raises(ValueError, match="a row of 1 cells in a table of 2 columns"):
        print_table(None, ["a", "b"], [["only one"]], target=out)


def test_plan_settings_list_every_plain_section_and_nested_table():
    plan = Plan.model_validate(
        {
            "gateway": {"port": 8123},
            "algorithm": {"loss": "ppo-clip", "correction": {"tis_cap": 2.0}},
            "scheduler": {"poll_s": 2.0},
        }
    )
    rows = dict(settings_rows(plan))
    assert rows["[gateway].port"] == "8123" and rows["[gateway].host"] == '"127.0.0.1"'
    assert rows["[gateway].token_mode"] == '"cumulative"'
    assert rows["[scheduler].poll_s"] == "2.0"
    assert rows["[algorithm.correction].tis_cap"] == "2.0"
    assert not any(key.startswith("[sft]") for key in rows)
    assert "[algorithm].loss" not in rows and "[algorithm].aux_losses" not in rows

    sft = dict(settings_rows(Plan.model_validate({"sft": {"data": "chats.jsonl"}})))
    assert sft["[sft].data"] == '"chats.jsonl"' and sft["[sft].epochs"] == "1"
