"""``network = "gateway"`` under bubblewrap: the sandbox reaches the real gateway through its
relay and nothing else on this machine or beyond; ``"full"`` reaches everything."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import msgspec
import pytest
from rllm_core.errors import SandboxCreateError
from rllm_core.testing.suites.sandboxes import run_with_deadline
from rllm_core.types import NetworkPolicy, SandboxSpec
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.testing import bubblewrap_problem

PROBLEM = bubblewrap_problem("test the gateway network of the local sandbox")
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")


def run(coro):  # type: ignore[no-untyped-def]
    return run_with_deadline(coro, 60)


def _host_address() -> str | None:
    """This machine's address on its default route (not loopback), when it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: routes, sends nothing
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


@contextlib.contextmanager
def _listening(host: str) -> Iterator[int]:
    """A TCP port on ``host`` that accepts connections and answers ``hello``."""
    server = socket.socket()
    server.bind((host, 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello\n")

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


def _connect(host: str, port: int) -> str:
    return f"timeout 5 bash -c 'exec 3<>/dev/tcp/{host}/{port} && echo connected'"


def _get(url: str, token: str) -> str:
    """A shell command printing the HTTP response to ``GET url/models`` (bash, no curl)."""
    parts = urlsplit(url)
    request = f"GET {parts.path}/models HTTP/1.0\\r\\nAuthorization: Bearer {token}\\r\\n\\r\\n"
    return (
        f"exec 3<>/dev/tcp/{parts.hostname}/{parts.port} && printf '{request}' >&3"
        " && timeout 10 cat <&3"
    )


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_gateway_mode_reaches_the_gateway_and_nothing_else(
    bwrap_backend: LocalBackend, gateway: Callable
) -> None:
    server, _ = gateway([])
    llm = server.endpoint("s-1")
    gateway_port = urlsplit(llm.base_url).port
    host = _host_address()
    spec = SandboxSpec(workdir="/app", network=NetworkPolicy.GATEWAY, gateway_url=llm.base_url)

    async def body(loopback: int, outside: int) -> None:
        async with await bwrap_backend.create(spec) as sb:
            inside = sb.gateway_url
            assert inside is not None and inside.startswith("http://127.0.0.1:"), inside
            assert urlsplit(inside).path == "/sessions/s-1/v1"
            r = await sb.exec(_get(inside, llm.api_key), timeout=20)
            assert r.stdout.startswith("HTTP/1.1 200"), (r.stdout, r.stderr)
            assert '"object":"list"' in r.stdout.replace(" ", "")
            blocked = [("127.0.0.1", loopback), ("127.0.0.1", gateway_port)]
            if host is not None:
                blocked += [(host, outside), (host, gateway_port)]
            for address, port in blocked:
                r = await sb.exec(_connect(address, port), timeout=20)
                assert r.stdout == "", f"a gateway sandbox reached {address}:{port}"
            # No part of the relay runs in the sandbox, for its processes to kill or replace.
            r = await sb.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout=10)
            assert "send_fds" not in r.stdout and "nsenter" not in r.stdout, r.stdout

        full = msgspec.structs.replace(spec, network=NetworkPolicy.FULL)
        async with await bwrap_backend.create(full) as sb:
            assert sb.gateway_url is None
            reached = [("127.0.0.1", loopback)] + ([(host, outside)] if host else [])
            for address, port in reached:
                r = await sb.exec(_connect(address, port), timeout=20)
                assert r.stdout == "connected\n", (address, port, r.stderr)

    with _listening("127.0.0.1") as loopback, _listening("0.0.0.0") as outside:
        run(body(loopback, outside))


def test_many_gateway_sandboxes_leave_nothing_behind(
    bwrap_backend: LocalBackend, gateway: Callable, host_processes_with
) -> None:
    server, _ = gateway([])
    before = _open_fds()

    async def one(index: int) -> None:
        llm = server.endpoint(f"s-{index}")
        spec = SandboxSpec(workdir="/app", network=NetworkPolicy.GATEWAY, gateway_url=llm.base_url)
        sb = await bwrap_backend.create(spec)
        try:
            r = await sb.exec(_get(sb.gateway_url or "", llm.api_key), timeout=20)
            assert r.stdout.startswith("HTTP/1.1 200"), (r.stdout, r.stderr)
            # A connection still open at close is dropped, not leaked.
            port = urlsplit(sb.gateway_url or "").port
            hold = f"(exec 3<>/dev/tcp/127.0.0.1/{port}; sleep 30) >/dev/null 2>&1 &"
            assert (await sb.exec(hold, timeout=10)).exit_code == 0
        finally:
            await sb.close()

    async def body() -> None:
        await asyncio.gather(*(one(index) for index in range(6)))

    run(body())
    assert _open_fds() <= before, "closing gateway sandboxes leaked file descriptors"
    assert host_processes_with("send_fds") == []


def test_a_gateway_url_the_relay_cannot_serve_is_refused(bwrap_backend: LocalBackend) -> None:
    spec = SandboxSpec(
        workdir="/app", network=NetworkPolicy.GATEWAY, gateway_url="https://gw.example:443/v1"
    )
    with pytest.raises(SandboxCreateError, match=r"https://gw\.example:443/v1"):
        run(bwrap_backend.create(spec))


def test_gateway_mode_without_a_gateway_reaches_nothing(bwrap_backend: LocalBackend) -> None:
    async def body(port: int) -> None:
        spec = SandboxSpec(workdir="/app", network=NetworkPolicy.GATEWAY)
        async with await bwrap_backend.create(spec) as sb:
            assert sb.gateway_url is None
            r = await sb.exec(_connect("127.0.0.1", port), timeout=20)
            assert r.stdout == ""

    with _listening("127.0.0.1") as port:
        run(body(port))
