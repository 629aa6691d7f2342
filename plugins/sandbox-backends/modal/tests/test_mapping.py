"""How a SandboxSpec and exec arguments become modal SDK calls, checked on the fake."""

from __future__ import annotations

import asyncio
import base64
import re
import shlex

import msgspec
import pytest
from rllm_core.errors import SandboxCommandTimeout, SandboxCreateError
from rllm_core.kit.remote_exec import EXEC_ROOT, kill_script
from rllm_core.types import NetworkPolicy, SandboxSpec
from rllm_sandbox_backend_modal.backend import RUN_TAG, ModalBackend
from rllm_sandbox_backend_modal.plugin import ModalConfig
from rllm_sandbox_backend_modal_tests_fake import FakeApp, FakeImage, FakeModal


def backend_over(fake: FakeModal, **config) -> ModalBackend:
    return ModalBackend(ModalConfig(create_interval_s=0.0, **config), client=fake)


def payloads(script: str) -> list[str]:
    """The files the kit's wrapper writes (``cmd.sh``, then ``run.sh``), decoded."""
    found = re.findall(r"printf %s ([A-Za-z0-9+/=]+) \| base64 -d", script)
    return [base64.b64decode(text).decode() for text in found]


def call_dir(script: str) -> str:
    found = re.match(rf"D=({re.escape(EXEC_ROOT)}/[a-z0-9]+)\n", script)
    assert found is not None, script[:200]
    return found.group(1)


def create_call(fake: FakeModal) -> dict:
    (kwargs,) = [kwargs for name, kwargs in fake.calls if name == "Sandbox.create"]
    return kwargs


def test_spec_maps_onto_sandbox_create(tmp_path):
    fake = FakeModal()
    backend = backend_over(fake, app_name="my-app", run_id="run-7", idle_timeout_s=300)
    spec = SandboxSpec(
        image="python:3.12-slim",
        workdir=str(tmp_path / "app"),
        cpu=2.5,
        memory_mb=4096,
        lifetime_s=1200.2,
        env={"TASK": "x"},
        network=NetworkPolicy.NONE,
        labels={"task": "t-1"},
    )

    async def body():
        async with await backend.create(spec):
            pass

    asyncio.run(body())
    kwargs = create_call(fake)
    assert kwargs["app"] == FakeApp(name="my-app", app_id="ap-0001")
    assert kwargs["image"] == FakeImage(("from_registry", "python:3.12-slim"))
    assert kwargs["cpu"] == 2.5
    assert kwargs["memory"] == 4096
    assert kwargs["timeout"] == 1201
    assert kwargs["idle_timeout"] == 300
    assert kwargs["block_network"] is True
    assert kwargs["env"] == {"TASK": "x"}
    assert kwargs["workdir"] == str(tmp_path / "app")
    assert kwargs["tags"] == {"task": "t-1", RUN_TAG: "run-7"}
    assert "region" not in kwargs
    assert ("App.lookup", {"name": "my-app", "env": None}) in fake.calls
    assert (tmp_path / "app").is_dir(), "the workdir was not created"


@pytest.mark.parametrize(
    ("spec", "config", "expected"),
    [
        (
            SandboxSpec(image="ubuntu:24.04", dockerfile="FROM x\n"),
            {},
            ("from_registry", "ubuntu:24.04"),
        ),
        (
            SandboxSpec(dockerfile="FROM alpine\nRUN true\n"),
            {},
            ("from_dockerfile", "FROM alpine\nRUN true\n"),
        ),
        (SandboxSpec(), {"default_image": "debian:12"}, ("from_registry", "debian:12")),
        (SandboxSpec(), {}, ("debian_slim",)),
    ],
)
def test_image_choice(tmp_path, spec, config, expected):
    fake = FakeModal()
    backend = backend_over(fake, **config)
    spec = msgspec.structs.replace(spec, workdir=str(tmp_path / "w"))

    async def body():
        async with await backend.create(spec):
            pass

    asyncio.run(body())
    assert create_call(fake)["image"] == FakeImage(expected)


def test_full_network_and_minimum_lifetime(tmp_path):
    fake = FakeModal()
    spec = SandboxSpec(workdir=str(tmp_path), network=NetworkPolicy.FULL, lifetime_s=0.2)

    async def body():
        async with await backend_over(fake, region="us-east").create(spec):
            pass

    asyncio.run(body())
    kwargs = create_call(fake)
    assert (kwargs["block_network"], kwargs["timeout"], kwargs["region"]) == (False, 1, "us-east")


@pytest.mark.parametrize("labels", [{"bad key": "v"}, {"k": "a/b"}, {"k": ""}, {"k": "x" * 64}])
def test_labels_modal_refuses_are_create_errors(tmp_path, labels):
    fake = FakeModal()
    spec = SandboxSpec(workdir=str(tmp_path), labels=labels)
    with pytest.raises(SandboxCreateError, match="cannot be a modal tag"):
        asyncio.run(backend_over(fake).create(spec))
    assert [name for name, _ in fake.calls if name == "Sandbox.create"] == []


def test_relative_workdir_is_refused():
    with pytest.raises(SandboxCreateError, match="'rel/dir' is relative"):
        asyncio.run(backend_over(FakeModal()).create(SandboxSpec(workdir="rel/dir")))


def test_exec_wraps_the_command_in_a_login_shell(tmp_path):
    fake = FakeModal()
    spec = SandboxSpec(workdir=str(tmp_path), env={"SPEC": "s p"})
    command = 'echo "$SPEC|$CALL" && pwd'

    async def body():
        async with await backend_over(fake).create(spec) as sb:
            result = await sb.exec(command, timeout=7.5, env={"CALL": "it's"}, cwd="sub dir")
            return result

    (tmp_path / "sub dir").mkdir()
    result = asyncio.run(body())
    assert result.stdout == f"s p|it's\n{tmp_path}/sub dir\n"
    (sandbox,) = fake.sandboxes
    (argv, options), *_ = sandbox.exec_calls
    assert argv[:2] == ("sh", "-c") and len(argv) == 3
    cmd_sh, run_sh = payloads(argv[2])
    assert cmd_sh == (
        "export SPEC='s p'\n"
        "export CALL='it'\"'\"'s'\n"
        f"cd -- {shlex.quote(str(tmp_path / 'sub dir'))} || exit 1\n"
        f"{command}"
    )
    assert f"bash -l {call_dir(argv[2])}/cmd.sh" in run_sh
    assert options == {"timeout": 9, "text": False}


def test_exec_user_goes_through_runuser(tmp_path):
    fake = FakeModal()

    async def body():
        async with await backend_over(fake).create(SandboxSpec(workdir=str(tmp_path))) as sb:
            with pytest.raises(Exception, match="not a valid account name"):
                await sb.exec("true", timeout=5, user="bad user")
            await sb.exec("true", timeout=5, user="someone")

    asyncio.run(body())
    ((argv, _),) = fake.sandboxes[0].exec_calls
    assert "\nU=someone\n" in argv[2]
    assert 'runuser -u "$U" --' in argv[2]


def test_modal_wait_returning_minus_one_is_a_timeout_and_kills_the_group(tmp_path):
    # Modal's deadline (0.5 s here) comes before ours (30 s): wait() returns -1 and the
    # process lives on, so the backend must kill it itself.
    fake = FakeModal(exec_deadline_s=0.5)
    command = "echo $$ > shell.pid; sleep 100 & echo $! > child.pid; sleep 100"

    async def body():
        async with await backend_over(fake).create(SandboxSpec(workdir=str(tmp_path))) as sb:
            with pytest.raises(SandboxCommandTimeout) as caught:
                await sb.exec(command, timeout=30)
            assert caught.value.timeout_s == 30 and caught.value.command == command
            fake.exec_deadline_s = None
            pids = [(tmp_path / name).read_text().strip() for name in ("shell.pid", "child.pid")]
            # A killed process may linger a moment as a zombie until its parent reaps it.
            check = " ; ".join(
                f"kill -0 {p} 2>/dev/null && ! grep -qs '^State:.*Z' /proc/{p}/status && echo {p}"
                for p in pids
            )
            for _ in range(30):
                alive = await sb.exec(check + "; true", timeout=10)
                if not alive.stdout:
                    break
                await asyncio.sleep(0.1)
            return alive.stdout, sb

    alive, _ = asyncio.run(body())
    assert alive == "", f"processes {alive.split()} outlived the timeout"
    (command_argv, _), (kill_argv, kill_options), *_ = fake.sandboxes[0].exec_calls
    call_id = call_dir(command_argv[2]).rpartition("/")[2]
    assert kill_argv == ("sh", "-c", kill_script(call_id))
    assert kill_options["timeout"] == 15


def test_sandbox_gone_after_remote_termination(tmp_path):
    from rllm_core.errors import SandboxGone

    fake = FakeModal()

    async def body():
        sb = await backend_over(fake).create(SandboxSpec(workdir=str(tmp_path)))
        await fake.sandboxes[0].terminate.aio()
        assert await sb.is_alive() is False
        with pytest.raises(SandboxGone) as caught:
            await sb.exec("true", timeout=5)
        assert type(caught.value.__cause__).__name__ == "SandboxTerminatedError"
        await sb.close()

    asyncio.run(body())


def test_missing_user_fails_creation_and_terminates(tmp_path):
    fake = FakeModal()
    spec = SandboxSpec(workdir=str(tmp_path), user="rllm_no_such_user")
    with pytest.raises(SandboxCreateError, match="cannot run as user 'rllm_no_such_user'"):
        asyncio.run(backend_over(fake).create(spec))
    assert fake.sandboxes[0].terminated is True


def test_a_command_too_long_for_one_argument_runs_from_an_uploaded_script(tmp_path):
    fake = FakeModal()
    command = "echo " + "x" * 150_000 + " | wc -c"

    async def body():
        async with await backend_over(fake).create(SandboxSpec(workdir=str(tmp_path))) as sb:
            return await sb.exec(command, timeout=30)

    result = asyncio.run(body())
    assert (result.exit_code, result.stdout.strip()) == (0, "150001")
    ((argv, _),) = fake.sandboxes[0].exec_calls
    assert re.fullmatch(rf"sh {re.escape(EXEC_ROOT)}/[a-z0-9]+\.sh; r=\$\?; rm -f .*", argv[2])


GATEWAY_URL = "http://203.0.113.7:8000/sessions/s-1/v1"


def _network_access(kwargs: dict):
    """What the modal SDK sends for the create call's network arguments."""
    from modal.sandbox._common import _build_outbound_network_access

    return _build_outbound_network_access(
        kwargs["block_network"],
        kwargs.get("outbound_cidr_allowlist"),
        kwargs.get("outbound_domain_allowlist"),
    )


@pytest.mark.parametrize(
    ("url", "cidrs", "domains"),
    [
        (GATEWAY_URL, ["203.0.113.7/32"], []),
        ("http://[2001:db8::7]:8000/v1", ["2001:db8::7/128"], []),
        ("https://gw.example.org/sessions/s-1/v1", [], ["gw.example.org"]),
    ],
    ids=["ipv4", "ipv6", "host-name"],
)
def test_gateway_network_allows_only_the_gateway_address(tmp_path, url, cidrs, domains):
    from modal_proto import api_pb2

    fake = FakeModal()
    spec = SandboxSpec(workdir=str(tmp_path), network=NetworkPolicy.GATEWAY, gateway_url=url)

    async def body():
        async with await backend_over(fake).create(spec) as sandbox:
            assert sandbox.gateway_url == url

    asyncio.run(body())
    access = _network_access(create_call(fake))
    assert access.network_access_type == api_pb2.NetworkAccess.NetworkAccessType.ALLOWLIST
    assert (list(access.allowed_cidrs), list(access.allowed_domains)) == (cidrs, domains)


def test_gateway_network_without_a_gateway_is_blocked(tmp_path):
    from modal_proto import api_pb2

    fake = FakeModal()
    spec = SandboxSpec(workdir=str(tmp_path), network=NetworkPolicy.GATEWAY)

    async def body():
        async with await backend_over(fake).create(spec) as sandbox:
            assert sandbox.gateway_url is None

    asyncio.run(body())
    access = _network_access(create_call(fake))
    assert access.network_access_type == api_pb2.NetworkAccess.NetworkAccessType.BLOCKED


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/v1", "http://localhost:8000/v1", "ftp://203.0.113.7/"]
)
def test_a_gateway_modal_cannot_reach_is_refused_before_creating(tmp_path, url):
    fake = FakeModal()
    spec = SandboxSpec(workdir=str(tmp_path), network=NetworkPolicy.GATEWAY, gateway_url=url)
    with pytest.raises(SandboxCreateError, match=re.escape(repr(url)[1:-1])):
        asyncio.run(backend_over(fake).create(spec))
    assert [name for name, _ in fake.calls if name == "Sandbox.create"] == []
