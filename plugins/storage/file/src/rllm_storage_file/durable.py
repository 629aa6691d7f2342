"""Crash-safe filesystem steps; they live in :mod:`rllm_core.storage.durable`."""

from __future__ import annotations

from rllm_core.storage.durable import (
    fsync_directory,
    make_directories,
    replace_file,
    sync_file,
    write_all,
)

__all__ = ["fsync_directory", "make_directories", "replace_file", "sync_file", "write_all"]
