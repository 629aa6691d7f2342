"""``rllm-core traces show`` on a run still writing its trace store: the store is opened
read-only, so the reader never fails on the writer's lock or a record being written, and the
writer (a real process) goes on appending undisturbed; every record it wrote reads back after."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from rllm_core.cli import main
from rllm_core.run.folder import RunFolder
from rllm_core.testing.suites.storage import expected_prompts, make_trace_chain

deltachain = pytest.importorskip("rllm_trace_store_deltachain.store")

COUNT = 300
SHOWN = 6
SEED = 21

_WRITER = textwrap.dedent(
    """
    import sys, time
    from rllm_core.testing.suites.storage import make_trace_chain
    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    path, count, shown, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with DeltaChainTraceStore(path, segment_bytes=8192, snapshot_every=4) as store:
        for index, record in enumerate(make_trace_chain("live", count, seed=seed)):
            store.append(record)
            if index + 1 == shown:
                print("ready", flush=True)
            time.sleep(0.002)
    print("done", flush=True)
    """
)


def _run_folder(root) -> RunFolder:
    """A run folder whose one episode is the first ``SHOWN`` calls of session ``live``."""
    folder = RunFolder.create(root, "live")
    traces = folder.path / "traces"
    resolved = {
        "path": "plan.toml",
        "plan": {"run": {"name": "live"}},
        "components": [
            {
                "where": "[trace_store]",
                "kind": "trace_store",
                "name": "deltachain",
                "provider": "rllm-trace-store-deltachain",
                "config": {"path": str(traces), "segment_bytes": 8192, "snapshot_every": 4},
            }
        ],
    }
    folder.write_plan("# plan\n", resolved)
    records = make_trace_chain("live", SHOWN, seed=SEED)
    episode = {
        "episode_id": f"{folder.path.name}-s1-t-0-a0",
        "session_id": "live",
        "task_id": "t",
        "step": 1,
        "reward": 1.0,
        "termination": "done",
        "signals": {},
        "completion_tokens": sum(len(r.completion_token_ids) for r in records),
        "trajectories": [{"lineage_id": "main", "trace_ids": [r.trace_id for r in records]}],
    }
    folder.append(folder.episodes, [episode])
    return folder


def test_traces_show_reads_a_store_a_writer_process_is_appending_to(tmp_path):
    folder = _run_folder(tmp_path / "runs")
    store = folder.path / "traces"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(store), str(COUNT), str(SHOWN), str(SEED)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    records = make_trace_chain("live", COUNT, seed=SEED)
    truth = expected_prompts(records)
    runner = CliRunner()
    reads = 0
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        while writer.poll() is None or reads == 0:
            result = runner.invoke(
                main, ["traces", "show", str(folder.path), "--episode", "s1-t-0-a0", "--json"]
            )
            assert result.exit_code == 0, result.output
            turns = json.loads(result.stdout)["turns"]
            assert [t["trace_id"] for t in turns] == [r.trace_id for r in records[:SHOWN]]
            assert not any(t["missing"] for t in turns)
            assert [t["prompt_tokens"] for t in turns] == [
                len(truth[r.trace_id]) for r in records[:SHOWN]
            ]
            reads += 1
        stdout, stderr = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, stderr
    assert stdout.strip().endswith("done")
    assert reads >= 3
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith("segment-")) == ["lock"]
    with deltachain.DeltaChainTraceStore(store, segment_bytes=8192, snapshot_every=4) as reopened:
        assert reopened.chain("live") == records
        assert [t.prompt_token_ids for t in reopened.session("live")] == [
            truth[r.trace_id] for r in records
        ]


def test_traces_show_reads_a_finished_store_and_leaves_its_files_as_they_were(tmp_path):
    folder = _run_folder(tmp_path / "runs")
    store = folder.path / "traces"
    with deltachain.DeltaChainTraceStore(store, segment_bytes=8192, snapshot_every=4) as writer:
        for record in make_trace_chain("live", SHOWN + 1, seed=SEED):
            writer.append(record)
    (segment,) = store.glob("segment-*.log")
    segment.write_bytes(segment.read_bytes()[:-3])  # the last call, torn
    before = {p.name: p.read_bytes() for p in store.iterdir()}
    result = CliRunner().invoke(
        main, ["traces", "show", str(folder.path), "--episode", "s1-t-0-a0", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["turns"]) == SHOWN
    assert {p.name: p.read_bytes() for p in store.iterdir()} == before
