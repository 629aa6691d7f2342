"""The installed CLI at 80 columns, over the first-party plugins: piped output is one
tab-separated line per record that grep finds, a terminal table keeps every name whole, and
every command that prints a table also prints JSON."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rllm_core.cli import main

ROOT = Path(__file__).resolve().parent.parent
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RULES = set("─━│┃┏┓┗┛┡┩╇")

# Every command that prints a table, as its words on the command line.
TABLE_COMMANDS = [
    ("plugins",),
    ("plan", "check"),
    ("runs", "show"),
    ("runs", "list"),
    ("traces", "show"),
    ("models", "list"),
    ("tasks", "check"),
]


def whole(name: str, text: str) -> bool:
    """Whether ``name`` stands on some line of ``text`` with nothing of a name around it."""
    pattern = re.compile(rf"(?<![\w:.-]){re.escape(name)}(?![\w-])")
    return any(pattern.search(line) for line in text.splitlines())


def test_piped_plugins_is_one_record_per_line_that_grep_finds(run_cli):
    records = run_cli("plugins", "--json").json()
    piped = run_cli("plugins", COLUMNS="80", RLLM_CORE_OUTPUT="auto")
    assert piped.returncode == 0, piped
    assert not set(piped.stdout) & RULES and "\x1b[" not in piped.stdout
    title, header, *lines = piped.stdout.splitlines()
    assert (title, header) == ("# rllm-core plugins", "Plugin\tVersion\tStatus\tProvides")
    assert len(lines) == len(records)
    for line, record in zip(lines, records, strict=True):
        fields = line.split("\t")
        assert fields[:3] == [record["distribution"], record["version"], record["status"]]
        assert fields[3].split("; ") == record["provides"], line
    losses = [line for line in lines if "loss" in line]
    assert any(line.startswith("rllm-loss-ppo\t") and "loss:ppo-clip" in line for line in losses)


def test_plugins_on_an_80_column_terminal_keeps_every_name_whole(run_cli):
    records = run_cli("plugins", "--json").json()
    shown = run_cli("plugins", COLUMNS="80", RLLM_CORE_OUTPUT="rich")
    assert shown.returncode == 0, shown
    text = ESCAPE.sub("", shown.stdout)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "┃ Plugin" in text, text
    for record in records:
        assert whole(record["distribution"], text), record["distribution"]
        for component in record["provides"]:
            kind, _, name = component.partition(":")
            assert whole(name, text) and whole(f"{kind}:", text), (component, text)


def test_plan_check_shows_gateway_scheduler_and_nested_settings(run_cli, tmp_path):
    plan = tmp_path / "plan.toml"
    # Named relative to the CLI's working folder (tmp_path), so the "plan ok: <path>" line does
    # not grow with pytest's temporary-folder counter.
    plan.write_text(
        '[algorithm]\nloss = "ppo-clip"\n[algorithm.correction]\ntis_cap = 2.0\n'
        "[gateway]\nport = 8123\n[scheduler]\npoll_s = 2.5\n"
    )
    piped = run_cli("plan", "check", plan.name, COLUMNS="80", RLLM_CORE_OUTPUT="auto")
    assert piped.returncode == 0, piped
    lines = piped.stdout.splitlines()
    for line in (
        "[gateway].host\t" + '"127.0.0.1"',
        "[gateway].port\t8123",
        "[gateway].token_mode\t" + '"cumulative"',
        "[scheduler].poll_s\t2.5",
        "[algorithm.correction].tis_cap\t2.0",
        "[rollout].max_concurrency\t8",
    ):
        assert line in lines, piped
    assert "Where\tComponent\tProvider\tConfig" in lines
    (loss,) = [line for line in lines if line.startswith("[algorithm].loss\t")]
    assert loss.split("\t")[1:3] == ["loss:ppo-clip", "rllm-loss-ppo 0.1.0"]

    shown = run_cli("plan", "check", plan.name, COLUMNS="80", RLLM_CORE_OUTPUT="rich")
    text = ESCAPE.sub("", shown.stdout)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert whole("[gateway].token_mode", text) and whole("loss:ppo-clip", text)
    data = run_cli("plan", "check", plan.name, "--json").json()
    assert data["plan"]["gateway"]["port"] == 8123


def test_every_command_that_prints_a_table_takes_json():
    for words in TABLE_COMMANDS:
        command = main
        for word in words:
            command = command.commands[word]
        options = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert "--json" in options, words


@pytest.mark.parametrize(
    "args",
    [
        ("models", "list", "--json"),
        ("tasks", "check", str(ROOT / "examples" / "tasks" / "shell"), "--json"),
        ("runs", "list", ".", "--json"),
    ],
    ids=["models", "tasks", "runs"],
)
def test_the_json_of_table_commands_parses(run_cli, args):
    done = run_cli(*args, COLUMNS="80")
    assert done.returncode == 0, done
    done.json()
