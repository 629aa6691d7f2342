"""Reading a model reply: the command it asks for and whether it says the task is done.

The reply format (the default system prompt teaches it):

- A command is the body of a fenced code block whose info string is ``bash``, ``sh``,
  ``shell`` or empty. The fences stand on their own lines; the closing fence has at least as
  many backticks as the opening one. Only the first such block counts; a block that is never
  closed, or holds only whitespace, is no command.
- The task is done when a line of the reply, outside every fenced block, is exactly the done
  marker (surrounding whitespace ignored).

A reply may hold both: the command runs, then the episode ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["COMMAND_LANGUAGES", "ParsedReply", "parse_reply"]

COMMAND_LANGUAGES = frozenset({"", "bash", "sh", "shell"})

_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^[ \t]*(?P=fence)`*[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_OPENING = re.compile(r"^[ \t]*`{3,}", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """``command`` is ``None`` when the reply holds no usable command block; ``blocks`` counts
    the command blocks found (only the first one runs)."""

    command: str | None
    done: bool
    blocks: int = 0


def parse_reply(text: str, done_marker: str) -> ParsedReply:
    """Find the first command block and the done marker in ``text``."""
    commands: list[str] = []
    outside: list[str] = []
    position = 0
    for match in _FENCE.finditer(text):
        outside.append(text[position : match.start()])
        position = match.end()
        language = match.group("info").strip().split(maxsplit=1)
        if (language[0].lower() if language else "") in COMMAND_LANGUAGES:
            body = match.group("body").rstrip("\n")
            if body.strip():
                commands.append(body)
    tail = text[position:]
    unclosed = _OPENING.search(tail)
    outside.append(tail[: unclosed.start()] if unclosed else tail)
    done = any(line.strip() == done_marker for line in "".join(outside).splitlines())
    return ParsedReply(command=commands[0] if commands else None, done=done, blocks=len(commands))
