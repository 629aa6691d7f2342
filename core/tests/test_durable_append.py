"""append_durably: a failed append leaves no torn tail, and says what failed."""

from __future__ import annotations

import errno
import os

import pytest
from rllm_core.errors import StorageError
from rllm_core.storage import durable


def half_then_full_disk(fd, data):
    os.write(fd, bytes(data)[: len(data) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


def test_an_append_lands_whole(tmp_path):
    path = tmp_path / "log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        durable.append_durably(fd, b"abc", end=0, fsync=True, what="x", on_lost_tail=lambda: None)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abc"


def test_a_failed_append_is_cut_back_and_named(tmp_path, monkeypatch):
    path = tmp_path / "log"
    path.write_bytes(b"kept")
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    lost: list[bool] = []
    monkeypatch.setattr(durable, "write_all", half_then_full_disk)
    try:
        with pytest.raises(StorageError, match=r"^appending to log failed: .*nothing was stored"):
            durable.append_durably(
                fd,
                b"0123456789",
                end=4,
                fsync=False,
                what="appending to log",
                on_lost_tail=lambda: lost.append(True),
            )
    finally:
        os.close(fd)
    assert path.read_bytes() == b"kept" and lost == []


def test_when_the_cut_fails_the_owner_is_told(tmp_path, monkeypatch):
    path = tmp_path / "log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    lost: list[bool] = []

    def no_truncate(fd, length):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(durable, "write_all", half_then_full_disk)
    monkeypatch.setattr(durable.os, "ftruncate", no_truncate)
    try:
        with pytest.raises(StorageError):
            durable.append_durably(
                fd, b"0123", end=0, fsync=False, what="w", on_lost_tail=lambda: lost.append(True)
            )
    finally:
        os.close(fd)
    assert lost == [True]
