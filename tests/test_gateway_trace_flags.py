"""A turn that missed a required tool call is flagged in its trace, and the flag survives the
deltachain store (written, reopened, read back)."""

from __future__ import annotations

import openai
from reference.toy_renderer import ToyChatRenderer
from rllm_core.gateway.server import Gateway
from rllm_core.testing.samplers import ScriptedSampler
from rllm_trace_store_deltachain.store import DeltaChainTraceStore

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'


def test_the_tool_choice_flag_is_stored_and_read_back(tmp_path):
    toy = ToyChatRenderer()
    store = DeltaChainTraceStore(tmp_path / "traces")
    sampler = ScriptedSampler(["Sunny.", CALL], renderer=toy)
    with Gateway(renderer=toy, sampler=sampler, trace_store=store) as gateway:
        api = openai.OpenAI(base_url=gateway.session_url("s"), api_key=gateway.token)
        for text in ("Weather?", "Weather now?"):
            api.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": text}],
                tools=[TOOL],
                tool_choice="required",
            )
    store.close()
    reopened = DeltaChainTraceStore(tmp_path / "traces", read_only=True)
    flags = {t.record.messages_delta[0].content: t.record.flags for t in reopened.session("s")}
    assert flags == {"Weather?": ("tool_choice_unmet",), "Weather now?": ()}
    reopened.close()
