"""The cli harness: a real agent program against the real gateway in the reference subprocess
sandbox, and exact steps, templating and outcome precedence against a scripted fake sandbox."""

from __future__ import annotations

import asyncio
import json
import sys

import pydantic
import pytest
from reference.subprocess_sandbox import SubprocessBackend
from rllm_core.errors import SandboxGone
from rllm_core.rollout.network import agent_endpoint, sandbox_spec
from rllm_core.types import (
    ExecResult,
    LLMEndpoint,
    NetworkPolicy,
    SandboxSpec,
    Task,
    Termination,
)
from rllm_harness_cli.harness import CliHarness
from rllm_harness_cli.plugin import CliConfig

LLM = LLMEndpoint(base_url="http://10.0.0.2:8000/sessions/s 1/v1", api_key="k3y", model="policy")
ENV = SandboxSpec(workdir="/app", user="agent", network=NetworkPolicy.FULL)
TASK = Task(task_id="t1", instruction="Say hi.", environment=ENV, agent_timeout_s=300)

AGENT = """\
import json, os, sys, urllib.request
instruction = open(os.environ["RLLM_INSTRUCTION_PATH"]).read()
body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": instruction}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "content-type": "application/json"},
)
reply = json.load(urllib.request.urlopen(request, timeout=30))
open("answer.txt", "w").write(reply["choices"][0]["message"]["content"])
if "--report" in sys.argv:
    outcome = {"termination": "done", "turns": 1, "answer": "from the agent"}
    open(os.environ["RLLM_OUTCOME_PATH"], "w").write(json.dumps(outcome))
print("agent finished")
"""

INSTALL = f"""\
set -e
agent_dir="$(dirname "$RLLM_OUTCOME_PATH")"
cat > "$agent_dir/agent.py" <<'PY'
{AGENT}PY
echo installed
"""


def run(harness: CliHarness, sandbox, task: Task = TASK, llm: LLMEndpoint = LLM):
    return asyncio.run(harness.run(task, llm, sandbox))


def cli(**keys) -> CliHarness:
    keys.setdefault("invocation", "agent --task {instruction_path}")
    return CliHarness(CliConfig(**keys))


def ok(code: int = 0, stdout: str = "", stderr: str = "") -> ExecResult:
    return ExecResult(exit_code=code, stdout=stdout, stderr=stderr)


@pytest.mark.parametrize("report", [False, True], ids=["exit-code", "outcome-file"])
def test_an_installed_agent_talks_to_the_gateway_from_the_sandbox(
    gateway, store, toy, tmp_path, report
):
    server, sampler = gateway(["hi there"])
    workdir = tmp_path / "w"
    task = Task(
        task_id="t1",
        instruction="Say hi.",
        environment=SandboxSpec(workdir=str(workdir)),
    )
    harness = cli(
        install=INSTALL,
        invocation=f"{sys.executable} {{agent_dir}}/agent.py" + (" --report" if report else ""),
        agent_dir=str(tmp_path / "agent"),
    )

    async def episode():
        backend = SubprocessBackend()
        llm = server.endpoint("cli-1")
        spec = sandbox_spec(task.environment, harness, llm)
        assert (spec.network, spec.gateway_url) == (NetworkPolicy.GATEWAY, llm.base_url)
        sandbox = await backend.create(spec)
        try:
            return await harness.run(task, agent_endpoint(spec, sandbox, llm), sandbox)
        finally:
            await backend.close()

    outcome = asyncio.run(episode())

    assert (workdir / "answer.txt").read_text() == "hi there"
    assert (tmp_path / "agent" / "instruction.md").read_text() == "Say hi."
    assert toy.decode(sampler.requests[0].prompt_token_ids) == (
        "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert len(store.chain("cli-1")) == 1
    assert outcome.metadata["exit_code"] == 0
    assert outcome.metadata["output_tail"] == "agent finished\n"
    assert outcome.metadata["install"]["exit_code"] == 0
    if report:
        assert (outcome.termination, outcome.turns, outcome.answer) == (
            Termination.DONE,
            1,
            "from the agent",
        )
        assert outcome.metadata["outcome_source"] == "file"
    else:
        assert (outcome.termination, outcome.turns, outcome.answer) == (Termination.DONE, 0, None)
        assert outcome.metadata["outcome_source"] == "exit_code"


def test_the_steps_their_users_and_the_uploaded_files(fake_sandbox):
    sandbox = fake_sandbox()
    outcome = run(
        cli(install="apt-get install -y agent\n", install_user="root", install_timeout_s=90),
        sandbox,
    )

    setup, install, invocation = sandbox.calls
    assert (setup.command, setup.user) == (
        "mkdir -p /tmp/rllm/agent && rm -f /tmp/rllm/agent/outcome.json",
        "agent",
    )
    assert (install.command, install.user, install.cwd, install.timeout) == (
        "bash /tmp/rllm/agent/install.sh",
        "root",
        "/app",
        90,
    )
    assert (invocation.command, invocation.user, invocation.cwd, invocation.timeout) == (
        "agent --task /tmp/rllm/agent/instruction.md",
        "agent",
        "/app",
        300,
    )
    assert install.env == invocation.env
    assert sandbox.files == {
        "/tmp/rllm/agent/instruction.md": b"Say hi.",
        "/tmp/rllm/agent/install.sh": b"apt-get install -y agent\n",
    }
    assert outcome.termination is Termination.DONE
    assert outcome.metadata["install"]["exit_code"] == 0


def test_the_environment_is_the_defaults_and_env_filled_in(fake_sandbox):
    sandbox = fake_sandbox()
    run(
        cli(
            env={"OPENAI_MODEL": "served-{model}", "AGENT_HOME": "{agent_dir}/home"},
            agent_dir="/opt/agent/",
            timeout_cap_s=90.5,
        ),
        sandbox,
    )
    assert sandbox.calls[-1].env == {
        "OPENAI_BASE_URL": "http://10.0.0.2:8000/sessions/s 1/v1",
        "OPENAI_API_KEY": "k3y",
        "OPENAI_MODEL": "served-policy",
        "RLLM_INSTRUCTION_PATH": "/opt/agent/instruction.md",
        "RLLM_OUTCOME_PATH": "/opt/agent/outcome.json",
        "RLLM_TIME_BUDGET_S": "90.5",
        "AGENT_HOME": "/opt/agent/home",
    }


def test_invocation_values_are_shell_quoted(fake_sandbox):
    sandbox = fake_sandbox()
    run(
        cli(invocation="run --url {base_url} --id {task_id} --cwd {workdir} --t {timeout_s}"),
        sandbox,
    )
    assert sandbox.calls[-1].command == (
        "run --url 'http://10.0.0.2:8000/sessions/s 1/v1' --id t1 --cwd /app --t 300"
    )


def test_literal_braces_survive_templating(fake_sandbox):
    sandbox = fake_sandbox()
    run(cli(invocation="echo ${{HOME}} {{}}"), sandbox)
    assert sandbox.calls[-1].command == "echo ${HOME} {}"


def test_the_cap_bounds_the_invocation_budget(fake_sandbox):
    sandbox = fake_sandbox()
    outcome = run(cli(timeout_cap_s=45), sandbox)
    assert sandbox.calls[-1].timeout == 45
    assert outcome.metadata["time_budget_s"] == 45
    run(cli(timeout_cap_s=4500), sandbox)
    assert sandbox.calls[-1].timeout == 300


def _invocation(answer):
    """A handler that answers ``answer(files)`` for the invocation and exit 0 otherwise."""

    def handler(call, files):
        if call.command.startswith("agent "):
            return answer(files)
        return None

    return handler


def test_past_the_budget_without_an_outcome_file_is_a_timeout(fake_sandbox):
    outcome = run(cli(), fake_sandbox(_invocation(lambda files: "timeout")))
    assert outcome.termination is Termination.TIMEOUT
    assert outcome.metadata["outcome_source"] == "elapsed"
    assert (outcome.metadata["timed_out"], outcome.metadata["exit_code"]) == (True, None)


def test_an_outcome_file_beats_the_elapsed_time_guess(fake_sandbox):
    def answer(files):
        files["/tmp/rllm/agent/outcome.json"] = json.dumps(
            {"termination": "context_length", "turns": 31, "metadata": {"tokens": 32768}}
        ).encode()
        return "timeout"

    outcome = run(cli(), fake_sandbox(_invocation(answer)))
    assert (outcome.termination, outcome.turns) == (Termination.CONTEXT_LENGTH, 31)
    assert outcome.metadata["outcome_source"] == "file"
    assert outcome.metadata["agent"] == {"tokens": 32768}
    assert outcome.metadata["timed_out"] is True


def test_an_outcome_file_beats_the_exit_code(fake_sandbox):
    def answer(files):
        files["/tmp/rllm/agent/outcome.json"] = b'{"termination": "max_turns", "turns": 50}'
        return ok(code=3)

    outcome = run(cli(), fake_sandbox(_invocation(answer)))
    assert (outcome.termination, outcome.turns) == (Termination.MAX_TURNS, 50)
    assert outcome.metadata["exit_code"] == 3


def test_a_bad_outcome_file_is_reported_and_ignored(fake_sandbox):
    def answer(files):
        files["/tmp/rllm/agent/outcome.json"] = b'{"termination": "finished"}'
        return "timeout"

    outcome = run(cli(), fake_sandbox(_invocation(answer)))
    assert outcome.termination is Termination.TIMEOUT
    assert outcome.metadata["outcome_file_error"].startswith(
        "/tmp/rllm/agent/outcome.json: Invalid enum value 'finished'"
    )


def test_a_non_zero_exit_without_an_outcome_file_is_done(fake_sandbox):
    outcome = run(cli(), fake_sandbox(_invocation(lambda files: ok(code=1, stderr="oops\n"))))
    assert outcome.termination is Termination.DONE
    assert (outcome.metadata["exit_code"], outcome.metadata["output_tail"]) == (1, "oops\n")


@pytest.mark.parametrize("code", [126, 127])
def test_an_agent_that_cannot_start_is_a_sandbox_error(fake_sandbox, code):
    answer = _invocation(lambda files: ok(code=code, stderr="bash: agent: command not found\n"))
    outcome = run(cli(), fake_sandbox(answer))
    assert outcome.termination is Termination.SANDBOX_ERROR
    assert (outcome.metadata["stage"], outcome.metadata["error_type"]) == (
        "invocation",
        "AgentNotStarted",
    )
    assert f"exit {code}" in outcome.metadata["error"]


def test_a_failed_install_stops_before_the_invocation(fake_sandbox):
    def handler(call, files):
        return (
            ok(code=2, stdout="fetching\n", stderr="no such package\n")
            if "install" in (call.command)
            else None
        )

    sandbox = fake_sandbox(handler)
    outcome = run(cli(install="apt-get install agent"), sandbox)

    assert outcome.termination is Termination.SANDBOX_ERROR
    assert len(sandbox.calls) == 2
    assert outcome.metadata["stage"] == "install"
    assert outcome.metadata["error"] == "the install script failed with exit code 2"
    assert outcome.metadata["output_tail"] == "fetching\nno such package\n"


def test_an_install_past_its_timeout_is_an_agent_setup_timeout(fake_sandbox):
    sandbox = fake_sandbox(lambda call, files: "timeout" if "install" in call.command else None)
    outcome = run(cli(install="sleep 1000", install_timeout_s=5), sandbox)
    assert outcome.termination is Termination.AGENT_SETUP_TIMEOUT
    assert outcome.metadata["stage"] == "install"
    assert outcome.metadata["error_type"] == "SandboxCommandTimeout"
    assert "ran past its 5 s timeout" in outcome.metadata["error"]


def test_a_sandbox_failure_names_the_step(fake_sandbox):
    gone = SandboxGone("sandbox sb-3 was reclaimed")
    outcome = run(cli(), fake_sandbox(_invocation(lambda files: gone)))
    assert outcome.termination is Termination.SANDBOX_ERROR
    assert (outcome.metadata["stage"], outcome.metadata["error_type"]) == (
        "invocation",
        "SandboxGone",
    )
    assert outcome.metadata["error"] == "sandbox sb-3 was reclaimed"


def test_a_failed_setup_is_a_sandbox_error(fake_sandbox):
    sandbox = fake_sandbox(lambda call, files: ok(code=1, stderr="Permission denied\n"))
    outcome = run(cli(), sandbox)
    assert outcome.termination is Termination.SANDBOX_ERROR
    assert outcome.metadata["stage"] == "setup"
    assert "Permission denied" in outcome.metadata["error"]
    assert len(sandbox.calls) == 1


def test_a_sandbox_created_without_the_declared_network_gets_a_warning(fake_sandbox, caplog):
    task = Task(task_id="t2", instruction="x", environment=SandboxSpec(workdir="/app"))
    outcome = run(cli(), fake_sandbox(), task)
    [warning] = outcome.metadata["warnings"]
    assert "the sandbox of task 't2' was created without the network" in warning
    assert "sandbox_network = 'gateway'" in warning
    assert warning in caplog.text


@pytest.mark.parametrize(
    ("keys", "declared"),
    [({}, NetworkPolicy.GATEWAY), ({"network": "full"}, NetworkPolicy.FULL)],
    ids=["default", "full"],
)
def test_the_network_key_is_what_the_rollout_gives_the_sandbox(keys, declared):
    harness = cli(**keys)
    assert harness.sandbox_network is declared
    for task_network in NetworkPolicy:
        spec = sandbox_spec(SandboxSpec(network=task_network), harness, LLM)
        wider = max(task_network, declared, key=lambda policy: policy.rank)
        assert spec.network is wider
        assert spec.gateway_url == (LLM.base_url if wider is NetworkPolicy.GATEWAY else None)
    with pytest.raises(pydantic.ValidationError, match="network"):
        CliConfig(invocation="agent", network="none")


def test_no_sandbox_is_a_usage_error():
    with pytest.raises(ValueError, match="needs a sandbox for task 't1'"):
        run(cli(), None)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"invocation": "agent {prompt}"}, "invocation uses the placeholder {prompt}"),
        ({"invocation": "echo ${HOME}"}, "invocation uses the placeholder {HOME}"),
        ({"invocation": "agent {"}, "invocation is not a valid template"),
        ({"invocation": "a", "env": {"X": "{key}"}}, "env.X uses the placeholder {key}"),
        ({"invocation": "a", "env": {"A=B": "1"}}, "invalid variable name 'A=B'"),
        ({"invocation": "a", "agent_dir": "agent"}, "agent_dir 'agent' must be an absolute"),
        ({"invocation": ""}, "at least 1 character"),
        ({}, "invocation"),
    ],
)
def test_bad_config_is_refused_with_the_key_named(keys, message):
    with pytest.raises(
        pydantic.ValidationError, match=message.replace("{", r"\{").replace("$", r"\$")
    ):
        CliConfig(**keys)
