"""Replies in Terminus-2's action formats, for scripted fake models in tests.

- :func:`json_reply`: the JSON object of the ``json`` parser (``analysis``, ``plan``,
  ``commands`` of ``keystrokes`` and ``duration``, ``task_complete``).
- :func:`xml_reply`: the ``<response>`` of the ``xml`` parser.

The agent ends an episode only when two replies in a row mark the task complete (the second
confirms the first).
"""

from __future__ import annotations

import json

__all__ = ["json_reply", "reply", "xml_reply"]


def json_reply(*commands: str, complete: bool = False, duration: float = 0.1) -> str:
    """A JSON reply typing each of ``commands`` (a newline appended, so it runs)."""
    return json.dumps(
        {
            "analysis": "Checking the terminal.",
            "plan": "Run the next command.",
            "commands": [{"keystrokes": f"{c}\n", "duration": duration} for c in commands],
            "task_complete": complete,
        }
    )


def xml_reply(*commands: str, complete: bool = False, duration: float = 0.1) -> str:
    """An XML reply typing each of ``commands`` (a newline appended, so it runs)."""
    keys = "".join(f'<keystrokes duration="{duration}">{c}\n</keystrokes>\n' for c in commands)
    done = "<task_complete>true</task_complete>\n" if complete else ""
    return (
        "<response>\n<analysis>Checking the terminal.</analysis>\n"
        "<plan>Run the next command.</plan>\n"
        f"<commands>\n{keys}</commands>\n{done}</response>"
    )


def reply(parser: str, *commands: str, complete: bool = False, duration: float = 0.1) -> str:
    """A reply in ``parser``'s format (``json`` or ``xml``)."""
    make = json_reply if parser == "json" else xml_reply
    return make(*commands, complete=complete, duration=duration)
