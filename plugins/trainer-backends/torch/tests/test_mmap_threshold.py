"""malloc_mmap_threshold_kb: freed host memory goes back to the system instead of staying in
glibc's heap."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rllm_core.errors import ComponentError
from rllm_trainer_backend_torch import loading
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.plugin import TorchBackendConfig

# Frees an 8 MiB tensor (glibc's sliding threshold rises to 8 MiB), then allocates 2 MiB and
# prints how many blocks glibc mapped on their own pages for it (mallinfo2's hblks).
PROBE = textwrap.dedent(
    """
    import ctypes, sys
    import torch
    from rllm_trainer_backend_torch.loading import fix_mmap_threshold

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    if len(sys.argv) > 1:
        fix_mmap_threshold(int(sys.argv[1]))
    big = torch.ones(2 * 2**20)
    del big
    before = libc.mallinfo2().hblks
    kept = torch.ones(2**19)
    print(libc.mallinfo2().hblks - before)
    """
)


def mapped_blocks(*arguments: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *arguments], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_a_fixed_threshold_maps_what_the_sliding_one_keeps_in_the_heap():
    assert mapped_blocks() == 0
    assert mapped_blocks("1024") == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_the_backend_fixes_the_threshold_it_is_given(monkeypatch, tiny_llama, tmp_path: Path):
    tiny_llama(3, vocab_size=64, max_position_embeddings=32).save_pretrained(tmp_path)
    fixed: list[int] = []
    monkeypatch.setattr("rllm_trainer_backend_torch.backend.fix_mmap_threshold", fixed.append)
    values = {"model": str(tmp_path), "device": "cpu", "lora": {"rank": 0}}
    TorchBackend(TorchBackendConfig(**values)).close()
    assert fixed == []
    TorchBackend(TorchBackendConfig(**values, malloc_mmap_threshold_kb=1024)).close()
    assert fixed == [1024]


def test_a_c_library_without_the_setting_is_named(monkeypatch):
    monkeypatch.setattr(loading, "_libc_function", lambda name, argtypes: None)
    with pytest.raises(ComponentError, match=r"malloc_mmap_threshold_kb = 512.*remove the key"):
        loading.fix_mmap_threshold(512)


def test_the_threshold_is_bounded_by_glibcs_largest():
    with pytest.raises(ValueError, match="malloc_mmap_threshold_kb"):
        TorchBackendConfig(malloc_mmap_threshold_kb=65536)
