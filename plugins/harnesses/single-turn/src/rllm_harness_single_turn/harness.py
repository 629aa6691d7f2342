"""The ``single-turn`` harness: one chat request, the reply is the answer."""

from __future__ import annotations

from typing import Any

from rllm_core.kit.chat import ModelCallError, chat, open_client
from rllm_core.ports import Sandbox
from rllm_core.types import HarnessOutcome, LLMEndpoint, Task, Termination

from rllm_harness_single_turn.plugin import SingleTurnConfig

__all__ = ["SingleTurnHarness"]


class SingleTurnHarness:
    """Sends the task's instruction (through ``user_template``, after ``system_prompt`` when
    set) as one chat request and returns the reply text as ``answer``.

    Outcomes: ``DONE`` with the answer and ``turns=1``; ``MODEL_ERROR`` when the reply is empty
    or the call failed; ``CONTEXT_LENGTH`` when the prompt does not fit. Metadata holds the
    reply's ``finish_reason``, or the error. The sandbox is not used and may be ``None``.
    """

    def __init__(self, config: SingleTurnConfig | None = None) -> None:
        self.config = config or SingleTurnConfig()

    def messages(self, task: Task) -> list[dict[str, str]]:
        """The request's messages for ``task``."""
        user = self.config.user_template.format(instruction=task.instruction, task_id=task.task_id)
        messages = [{"role": "user", "content": user}]
        if self.config.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        return messages

    async def run(self, task: Task, llm: LLMEndpoint, sandbox: Sandbox | None) -> HarnessOutcome:
        client = open_client(
            llm, timeout_s=self.config.request_timeout_s, max_retries=self.config.max_retries
        )
        try:
            reply = await chat(
                client, llm.model, self.messages(task), max_tokens=self.config.max_tokens
            )
        except ModelCallError as exc:
            return HarnessOutcome(termination=exc.termination, turns=0, metadata=exc.details)
        finally:
            await client.close()
        metadata: dict[str, Any] = {"finish_reason": reply.finish_reason}
        if not reply.content.strip():
            metadata["error"] = "the model's reply is empty"
            return HarnessOutcome(
                termination=Termination.MODEL_ERROR, answer="", turns=1, metadata=metadata
            )
        return HarnessOutcome(
            termination=Termination.DONE, answer=reply.content, turns=1, metadata=metadata
        )
