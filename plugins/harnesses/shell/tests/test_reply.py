"""The reply format: which block is the command and when the model says it is done."""

from __future__ import annotations

import pytest
from rllm_harness_shell.reply import ParsedReply, parse_reply


def parse(text: str) -> ParsedReply:
    return parse_reply(text, "DONE")


@pytest.mark.parametrize("info", ["bash", "sh", "shell", "", "Bash", "bash title=x"])
def test_a_shell_fence_holds_the_command(info):
    text = f"Let me look.\n```{info}\nls -la /app\n```\n"
    assert parse(text) == ParsedReply(command="ls -la /app", done=False, blocks=1)


def test_a_multiline_command_keeps_its_lines_and_indentation():
    text = "```bash\ncat > a.txt <<'EOF'\n  indented\nEOF\n```"
    assert parse(text).command == "cat > a.txt <<'EOF'\n  indented\nEOF"


def test_the_first_of_several_blocks_runs():
    text = "```bash\necho one\n```\nthen\n```sh\necho two\n```"
    assert parse(text) == ParsedReply(command="echo one", done=False, blocks=2)


def test_blocks_in_other_languages_are_not_commands():
    text = "```python\nprint(1)\n```\n```bash\necho shell\n```"
    assert parse(text) == ParsedReply(command="echo shell", done=False, blocks=1)
    assert parse("```python\nprint(1)\n```").command is None


@pytest.mark.parametrize(
    "text",
    [
        "I think the file is fine.",
        "`ls` inline code is not a block",
        "```bash\nls -la\n",  # never closed
        "```bash\n   \n```",  # only whitespace
        "```bash ls```",  # fences must stand on their own lines
        "",
    ],
)
def test_no_usable_block_is_no_command(text):
    assert parse(text).command is None


def test_a_longer_fence_may_hold_a_shorter_one():
    text = "````bash\nprintf '```\\n' > fence.md\n````"
    assert parse(text).command == "printf '```\\n' > fence.md"


@pytest.mark.parametrize(
    ("text", "done"),
    [
        ("DONE", True),
        ("All files are in place.\n  DONE  \n", True),
        ("DONE.", False),
        ("I am DONE", False),
        ("done", False),
        ("```bash\necho\nDONE\n```", False),
        ("```bash\necho\nDONE\n", False),  # inside a block that never closes
        ("```text\nDONE\n```\nDONE", True),
    ],
)
def test_the_done_marker_is_a_line_of_its_own_outside_blocks(text, done):
    assert parse(text).done is done


def test_a_command_and_the_marker_in_one_reply():
    assert parse("```bash\ntouch ok\n```\nDONE") == ParsedReply(
        command="touch ok", done=True, blocks=1
    )


def test_the_marker_is_configurable():
    assert parse_reply("<done/>", "<done/>").done
    assert not parse_reply("DONE", "<done/>").done
