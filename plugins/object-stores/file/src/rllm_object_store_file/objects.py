"""The ``file`` object store: one file per key under ``root/objects``, written atomically and
fsynced (:class:`~rllm_core.storage.folder_objects.FolderObjectStore`, whose rules hold here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllm_core.storage.folder_objects import FolderObjectStore

if TYPE_CHECKING:
    from rllm_object_store_file.plugin import FileObjectStoreConfig

__all__ = ["FileObjectStore"]


class FileObjectStore(FolderObjectStore):
    """An :class:`~rllm_core.ports.ObjectStore` in the directory ``root``. Thread-safe, and
    safe for several processes sharing ``root`` on one machine."""

    @classmethod
    def from_config(cls, config: FileObjectStoreConfig) -> FileObjectStore:
        """Build from the validated plan config (the component factory)."""
        return cls(config.root)
