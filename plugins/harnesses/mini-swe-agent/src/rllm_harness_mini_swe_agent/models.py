"""mini-swe-agent's litellm models, pointed at the episode's gateway session.

:class:`ToolcallModel` is the library's ``LitellmModel`` (actions are calls of its ``bash``
tool), :class:`TextbasedModel` its ``LitellmTextbasedModel`` (actions are
```` ```mswea_bash_command ```` blocks). Both keep the library's request, parsing and
observation formatting, and change three things:

- the library's own retry loop is off (every exception aborts it): a refused prompt must end
  the episode at once, and the client's ``max_retries`` covers connection errors, 429 and 5xx;
- a call checks the episode's :class:`~rllm_harness_mini_swe_agent.bridge.LoopBridge` first, so
  a stopped episode makes no further calls;
- ``answered`` counts the calls the model answered, valid action or not: the episode's turns.
"""

from __future__ import annotations

from typing import Any, ClassVar

import litellm
from minisweagent.exceptions import FormatError
from minisweagent.models.litellm_model import LitellmModel
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

from rllm_harness_mini_swe_agent.bridge import LoopBridge

__all__ = ["TextbasedModel", "ToolcallModel"]

# litellm prints a help banner on stdout with every failed call otherwise.
litellm.suppress_debug_info = True


class _GatewayCalls:
    abort_exceptions: ClassVar[list[type[BaseException]]] = [Exception]

    def __init__(self, *, bridge: LoopBridge, **kwargs: Any) -> None:
        self.bridge = bridge
        self.answered = 0
        super().__init__(**kwargs)

    def query(self, messages: list[dict[str, str]], **kwargs: Any) -> dict:
        self.bridge.check()
        try:
            message = super().query(messages, **kwargs)  # type: ignore[misc]
        except FormatError:
            self.answered += 1
            raise
        self.answered += 1
        return message


class ToolcallModel(_GatewayCalls, LitellmModel):
    """Actions are calls of the library's ``bash`` tool."""


class TextbasedModel(_GatewayCalls, LitellmTextbasedModel):
    """Actions are the first ```` ```mswea_bash_command ```` block of the reply."""
