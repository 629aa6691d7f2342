"""Deterministic numerics for the torch backend, and the report of what its results depend on.

With ``deterministic = true`` the backend, before it computes anything, puts the reproducible
environment of :mod:`rllm_core.numerics` in place (MKL reads ``MKL_CBWR`` at its first
computation, so this also covers a backend built outside ``rllm-core run``), turns on torch's
deterministic algorithms and, on CUDA, cuDNN's deterministic kernels without autotuning.
:func:`mkl_cbwr_mode` asks MKL which mode it actually runs in, so a process where MKL had
already computed before the backend was built is reported, not assumed away.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from importlib import metadata
from typing import Any

import torch
from rllm_core.numerics import REPRODUCIBLE_ENVIRONMENT, prepare_environment

__all__ = ["mkl_cbwr_mode", "numerics_report", "use_deterministic_numerics"]

_CBWR_ALL = -1
_CBWR_STRICT = 0x10000
_CBWR_BRANCHES = {
    0: "OFF",
    1: "OFF",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}
"""MKL's code-path constants (``mkl_cbwr.h``); 0 and 1 both mean no reproducibility branch."""


def _mkl_cbwr_get() -> Any:
    """MKL's settings query as exported by torch's CPU library, or None (no MKL, other OS)."""
    if not torch.backends.mkl.is_available():
        return None
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        query = ctypes.CDLL(library).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    query.argtypes = [ctypes.c_int]
    query.restype = ctypes.c_int
    return query


def mkl_cbwr_mode() -> str | None:
    """MKL's conditional numerical reproducibility as MKL reports it: ``"AUTO,STRICT"``,
    ``"COMPATIBLE"``, ``"OFF"``...; None when this torch has no MKL or does not export the
    query. Asking fixes the mode for the process: call it only after the environment is set."""
    query = _mkl_cbwr_get()
    if query is None:
        return None
    settings = query(_CBWR_ALL) & 0xFFFFFFFF
    branch = _CBWR_BRANCHES.get(settings & 0xFFFF, str(settings & 0xFFFF))
    return f"{branch},STRICT" if settings & _CBWR_STRICT else branch


def _deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True)`` without importing ``torch._inductor``.

    The public call imports inductor only to set its ``deterministic`` flag, which costs about
    a second in every run process, and nothing here compiles. Inductor, were it imported later,
    reads the same flag from ``TORCHINDUCTOR_DETERMINISTIC``; where inductor is loaded already,
    or this torch lacks the setter, the public call runs."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True)
        return
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    setter(True, warn_only=False)


def use_deterministic_numerics(deterministic: bool, device: torch.device) -> None:
    """Switch the process to reproducible numerics (``deterministic``), or leave it as it is.

    Warns when MKL already runs in another mode than the environment asks for (it computed
    before this call, in a process started without ``MKL_CBWR``): that process's results may
    then depend on memory alignment."""
    if not deterministic:
        return
    prepare_environment(True)
    _deterministic_algorithms()
    torch.backends.mkldnn.deterministic = True
    if device.type == "cuda":
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    wanted = os.environ.get("MKL_CBWR")
    actual = mkl_cbwr_mode()
    if wanted == REPRODUCIBLE_ENVIRONMENT["MKL_CBWR"] and actual not in (None, wanted):
        warnings.warn(
            f"MKL runs in mode {actual!r}, not MKL_CBWR={wanted!r}: it computed before the"
            " torch backend was built; start the process with MKL_CBWR=AUTO,STRICT in its"
            " environment for bitwise reproducible results",
            RuntimeWarning,
            stacklevel=3,
        )


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def numerics_report(device: torch.device, dtype: str) -> dict[str, Any]:
    """What the backend's results depend on, read from the libraries themselves."""
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "peft": _version("peft"),
        "device": str(device),
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "onednn_deterministic": bool(torch.backends.mkldnn.deterministic),
        "mkl_cbwr": mkl_cbwr_mode(),
    }
    if device.type == "cuda":
        report["cuda"] = torch.version.cuda
        report["gpu"] = torch.cuda.get_device_name(device)
        report["cudnn_deterministic"] = torch.backends.cudnn.deterministic
    return report
