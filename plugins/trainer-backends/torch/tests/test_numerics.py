"""The torch backend's reproducible mode, as MKL and torch themselves report it.

Each case runs in a fresh Python process started without ``MKL_CBWR``: MKL fixes its mode at
its first computation, so only a new process shows what the backend sets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.backends.mkl.is_available(), reason="this torch is built without MKL"
)

CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import torch
    from rllm_trainer_backend_torch.numerics import mkl_cbwr_mode, use_deterministic_numerics

    deterministic, compute_first = sys.argv[1] == "on", sys.argv[2] == "early"
    if compute_first:
        (torch.ones(8, 8) @ torch.ones(8, 8)).sum()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use_deterministic_numerics(deterministic, torch.device("cpu"))
    (torch.ones(8, 8) @ torch.ones(8, 8)).sum()
    inductor_loaded = "torch._inductor.config" in sys.modules
    import torch._inductor.config as inductor
    print(json.dumps({
        "mkl_cbwr": mkl_cbwr_mode(),
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warnings": [str(w.message) for w in caught],
        "inductor": [inductor_loaded, inductor.deterministic],
    }))
    """
)


def child(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "CUBLAS_WORKSPACE_CONFIG")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_deterministic_puts_mkl_in_strict_mode_and_torch_in_deterministic_algorithms():
    # Inductor is not imported for it (a second per process), and is deterministic once it is.
    assert child("on", "late") == {
        "mkl_cbwr": "AUTO,STRICT",
        "algorithms": True,
        "warnings": [],
        "inductor": [False, True],
    }


def test_speed_mode_leaves_both_at_their_defaults():
    assert child("off", "late") == {
        "mkl_cbwr": "OFF",
        "algorithms": False,
        "warnings": [],
        "inductor": [False, False],
    }


def test_mkl_that_computed_first_is_reported_and_warned_about():
    found = child("on", "early")
    assert found["mkl_cbwr"] == "OFF"
    (warning,) = found["warnings"]
    assert "MKL runs in mode 'OFF', not MKL_CBWR='AUTO,STRICT'" in warning
