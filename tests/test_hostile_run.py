"""A hostile agent in a real ``rllm-core run``: the cli harness runs, in each episode's
bubblewrap sandbox on the gateway network, an agent program that holds its session token and
tries to list, read, write into and delete the other episodes' sessions, to read the gateway's
metrics and to call a vLLM dev route on the host, then makes one honest model call.

Every attempt is refused (403) or unreachable; the stand-in dev server sees no request; every
episode's traces are intact and the step trains on them; the refusals are counted in the
``security/denied`` metric and named in ``run.log``.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reference.cli_process import run_cli, run_folder
from rllm_core.plugins import PluginManager

ROOT = Path(__file__).resolve().parents[1]
SHELL_TASKS = ROOT / "examples" / "tasks" / "shell"
# What the agent tries with its own token, each expected to be refused with a 403.
ATTEMPTS = ("list", "read", "write", "delete", "metrics")
# The system interpreter: the sandbox binds the host's /usr, not an interpreter elsewhere.
PYTHON = "/usr/bin/python3"

AGENT = """\
import json, os, urllib.error, urllib.request

base = os.environ["OPENAI_BASE_URL"]
root, _, rest = base.partition("/sessions/")
own = rest.split("/")[0]
other = own[:-1] + ("1" if own[-1] != "1" else "0")
token = os.environ["OPENAI_API_KEY"]
chat = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": "hi"}]}


def call(method, url, body=None, bearer=True):
    headers = {"content-type": "application/json"}
    if bearer:
        headers["authorization"] = "Bearer " + token
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return "unreachable: " + type(error).__name__


results = {
    "list": call("GET", root + "/sessions"),
    "read": call("GET", root + "/sessions/" + other + "/traces"),
    "write": call("POST", root + "/sessions/" + other + "/v1/chat/completions", chat),
    "delete": call("DELETE", root + "/sessions/" + other),
    "metrics": call("GET", root + "/metrics"),
    "dev_loopback": call("POST", os.environ["DEV_LOOPBACK"] + "/collective_rpc", {}, False),
    "dev_host": call("POST", os.environ["DEV_HOST"] + "/pause", {}, False),
    "own": call("POST", base + "/chat/completions", chat),
}
print("HOSTILE " + json.dumps(results))
"""

INSTALL = f"""\
set -e
cat > "$(dirname "$RLLM_OUTCOME_PATH")/hostile.py" <<'PY'
{AGENT}PY
"""


def _host_address() -> str:
    """This machine's address on its default route (not loopback)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        return probe.getsockname()[0]


class _DevServer(http.server.ThreadingHTTPServer):
    """Stands for a vLLM server in dev mode on the host: it answers anything, and remembers."""

    def __init__(self, host: str) -> None:
        self.seen: list[str] = []
        super().__init__((host, 0), _Record)


class _Record(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.server.seen.append(f"{self.command} {self.path}")  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def dev_servers() -> Iterator[dict[str, _DevServer]]:
    servers = {"loopback": _DevServer("127.0.0.1"), "host": _DevServer(_host_address())}
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers.values()]
    for thread in threads:
        thread.start()
    yield servers
    for server in servers.values():
        server.shutdown()
        server.server_close()


def _plan(tmp_path: Path, model: Path, servers: dict[str, _DevServer]) -> Path:
    loopback, host = (servers[k].server_address for k in ("loopback", "host"))
    plan = tmp_path / "plan.toml"
    plan.write_text(
        f"""\
[run]
name = "hostile"
seed = 0
steps = 1
save_every = 0

[algorithm]
loss = {{ name = "dppo-tv", delta = 0.15 }}
advantage = {{ name = "grpo" }}
group_size = 2
batch_size = 2
drop_zero_variance_groups = false

[sampling]
temperature = 1.0
max_tokens = 8

[trainer]
name = "torch"
model = {json.dumps(str(model))}
device = "cpu"
learning_rate = 1e-4
cpu_threads = 1

[renderer]
name = "chatml"

[tasks]
name = "harbor"
path = {json.dumps(str(SHELL_TASKS))}
limit = 2

[sandbox]
name = "local"
isolation = "bwrap"

[harness]
name = "cli"
install = {json.dumps(INSTALL)}
invocation = "{PYTHON} {{agent_dir}}/hostile.py"
env.DEV_LOOPBACK = "http://{loopback[0]}:{loopback[1]}"
env.DEV_HOST = "http://{host[0]}:{host[1]}"

[trace_store]
name = "deltachain"
path = "traces"
"""
    )
    return plan


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_hostile_agent_reaches_only_its_own_session(tiny_smol_model_dir, dev_servers, tmp_path):
    pytest.importorskip("rllm_sandbox_backend_local.testing").require_bubblewrap(
        "run agents on the gateway network"
    )
    plan = _plan(tmp_path, tiny_smol_model_dir, dev_servers)
    result = run_cli("run", str(plan), "--plain", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "hostile")

    assert dev_servers["loopback"].seen == [] and dev_servers["host"].seen == []

    episodes = _jsonl(run_dir / "episodes.jsonl")
    assert len(episodes) == 4
    for episode in episodes:
        assert episode["denied"] == len(ATTEMPTS), episode
        # the one honest call is the episode's only trace: nothing was written into it
        (trajectory,) = episode["trajectories"]
        assert len(trajectory["trace_ids"]) == 1

    (line,) = _jsonl(run_dir / "metrics.jsonl")
    assert line["security/denied"] == 4 * len(ATTEMPTS)
    assert line["trained"] == 1.0 and line["datums"] == 4.0
    assert json.loads((run_dir / "summary.json").read_text())["security_denied"] == 4 * len(
        ATTEMPTS
    )

    resolved = json.loads((run_dir / "plan.resolved.json").read_text())
    (store_entry,) = [c for c in resolved["components"] if c["where"] == "[trace_store]"]
    config = dict(store_entry["config"], path=str(tmp_path / store_entry["config"]["path"]))
    store = PluginManager().get("trace_store", store_entry["name"]).build(config)
    try:
        for episode in episodes:
            traces = store.session(episode["session_id"])
            assert [t.record.trace_id for t in traces] == episode["trajectories"][0]["trace_ids"]
            assert all(t.chain_complete for t in traces)
    finally:
        store.close()

    log = (run_dir / "run.log").read_text()
    for episode in episodes:
        sid = episode["session_id"]
        denials = [ln for ln in log.splitlines() if "denied" in ln and repr(sid) in ln]
        assert len(denials) == len(ATTEMPTS), (sid, denials)
        assert any("GET '/sessions': 403 admin_only" in ln for ln in denials)
        assert any("/traces" in ln and "other_session" in ln for ln in denials)
        assert any(
            f"refused {len(ATTEMPTS)} request(s)" in ln and sid in ln for ln in log.splitlines()
        )
