"""Completions in mini-swe-agent's action formats, for scripted fake models in tests.

- :func:`text_action`: a reply of the text-based agent, one ```` ```mswea_bash_command ````
  block (``mini_textbased.yaml``'s format).
- :func:`tool_call`: a reply calling the agent's ``bash`` tool, written as Hermes-style
  ``<tool_call>`` JSON, the form the ``qwen2.5`` chatml template (and the test suite's toy
  renderer) parses back into a tool call.
- :data:`SUBMIT`: the command whose output the library's submit check reads.
"""

from __future__ import annotations

import json

__all__ = ["SUBMIT", "text_action", "tool_call"]

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def text_action(command: str, thought: str = "THOUGHT: the next step.") -> str:
    """A text-based reply: ``thought``, then ``command`` in the action block."""
    return f"{thought}\n\n```mswea_bash_command\n{command}\n```"


def tool_call(command: str, thought: str = "") -> str:
    """A tool-calling reply: ``thought`` (when given), then one ``bash`` call of
    ``command``."""
    call = json.dumps({"name": "bash", "arguments": {"command": command}})
    block = f"<tool_call>\n{call}\n</tool_call>"
    return f"{thought}\n{block}" if thought else block
