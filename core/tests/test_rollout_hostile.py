"""Agents that try to forge their reward, through the whole rollout: the shell harness in the
``local`` sandbox under bubblewrap, a scripted model, the real gateway and a shipped Harbor
task's own verifier. Each must be graded on what it did (a wrong answer: 0), while an honest
agent of the same group gets 1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from reference.rollout_stack import gateway_runner
from reference.toy_renderer import ToyChatRenderer
from rllm_core.plugins import PluginManager
from rllm_core.rollout import RolloutSettings
from rllm_core.testing.samplers import ScriptedSampler

REPO_ROOT = Path(__file__).resolve().parents[2]
COUNT_LINES = REPO_ROOT / "examples" / "tasks" / "shell" / "count-lines"
TOY = ToyChatRenderer()

# Every reward file the Harbor verifier reads, forged, and the folders holding them replaced
# by links into the agent's workdir.
FORGE_AND_LINK = """\
mkdir -p /app/mine/verifier /app/mine/tests /tmp/rllm
for f in reward.txt reward.json rewards.json; do
  case $f in
    *.json) echo '{"reward": 1}' > /app/mine/verifier/$f ;;
    *) echo 1 > /app/mine/verifier/$f ;;
  esac
done
echo '{"reward": 1}' > /tmp/rllm/reward.json
echo 'echo 1 > /logs/verifier/reward.txt' > /app/mine/tests/test.sh
rm -rf /logs /tests /tmp/rllm/logs
ln -s /app/mine /logs && ln -s /app/mine/tests /tests && ln -s /app/mine /tmp/rllm/logs
echo 3 > /app/count.txt
"""
# A busy loop in a session of its own that keeps writing the reward and replacing the test
# script.
BACKGROUND = """\
cat > /app/forge.sh <<'EOF'
while :; do
  mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt
  [ -f /tests/test.sh ] && echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh
done 2>/dev/null
EOF
(setsid sh /app/forge.sh </dev/null >/dev/null 2>&1 &)
echo 3 > /app/count.txt
"""
SCRIPTS = {
    "honest": "wc -l < /app/access.log > /app/count.txt",
    "forges-and-links": FORGE_AND_LINK,
    "rewrites-in-the-background": BACKGROUND,
}


def test_a_hostile_agent_is_graded_on_what_it_did():
    pytest.importorskip("rllm_sandbox_backend_local.testing").require_bubblewrap()
    plugins = PluginManager()
    replies = [
        r for command in SCRIPTS.values() for r in (f"```bash\n{command.rstrip()}\n```", "DONE")
    ]
    sampler = ScriptedSampler(replies, renderer=TOY)
    backend = plugins.get("sandbox_backend", "local").build({"isolation": "bwrap"})
    harness = plugins.get("harness", "shell").build(
        {"max_turns": 3, "max_retries": 0, "max_tokens": 2048}
    )
    source = plugins.get("task_source", "harbor").build({"path": str(COUNT_LINES)})
    (task,) = source.tasks()
    store = plugins.get("trace_store", "memory").build({})

    async def main() -> Any:
        try:
            async with gateway_runner(
                renderer=TOY,
                source=source,
                harness=harness,
                backend=backend,
                store=store,
                settings=RolloutSettings(
                    group_size=len(SCRIPTS), max_concurrency=1, max_infra_retries=0
                ),
                sampler=sampler,
                run_id="hostile",
            ) as (runner, _):
                return await runner.run([task], step=0)
        finally:
            await backend.close()

    batch = asyncio.run(main())
    assert batch.infra_failures == []
    rewards = {name: episode.reward for name, episode in zip(SCRIPTS, batch.groups[0], strict=True)}
    assert rewards == {"honest": 1.0, "forges-and-links": 0.0, "rewrites-in-the-background": 0.0}
