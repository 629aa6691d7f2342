"""``--json`` on the commands that end with a summary (``run``, ``eval``, ``sft``): stdout holds
only the summary object, whatever the command's libraries and subprocesses write, and the
ranks torchrun starts get the flag too. The commands themselves are run end to end with it in
tests/test_eval_end_to_end.py and tests/test_sft_packing.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rllm_core.cli.run_cmd import _run_args, run

SCRIPT = """
import os, subprocess, sys
from pathlib import Path
from rllm_core.cli.run_cmd import print_summary_json, stdout_to_stderr

folder = Path(sys.argv[1])
with stdout_to_stderr():
    print("from python")
    os.write(1, b"from the descriptor\\n")
    subprocess.run([sys.executable, "-c", "print('from a subprocess')"], check=True)
(folder / "summary.json").write_text('{"status": "finished", "last_step": 1}')
print_summary_json({}, folder, folder / "summary.json")
"""


def test_stdout_holds_only_the_summary_object(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "status": "finished",
        "last_step": 1,
        "run_folder": str(tmp_path),
        "summary": str(tmp_path / "summary.json"),
    }
    for line in ("from python", "from the descriptor", "from a subprocess"):
        assert line in done.stderr.splitlines()


def test_the_ranks_torchrun_starts_get_json_and_the_role() -> None:
    args = _run_args(Path("p.toml"), ("run.steps=3",), None, False, True, "trainer", False, True)
    expected = ["run", "p.toml", "--set", "run.steps=3", "--plain", "--role", "trainer", "--json"]
    assert args == expected
    params = run.make_context("run", args[1:]).params
    assert params["as_json"] is True and params["role"] == "trainer" and params["plain"] is True
    plain = _run_args(Path("p.toml"), (), None, True, False, "both", False, False)
    assert plain == ["run", "p.toml", "--quiet"]
    assert run.make_context("run", plain[1:]).params["as_json"] is False
