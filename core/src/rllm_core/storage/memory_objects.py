"""An :class:`~rllm_core.ports.ObjectStore` in memory: for tests, simulations and runs that
need the port within one process. Nothing survives the process."""

from __future__ import annotations

import threading

from rllm_core.errors import ObjectNotFoundError
from rllm_core.storage.keys import check_key

__all__ = ["MemoryObjectStore"]


class MemoryObjectStore:
    """Objects in a dict behind a lock; keys follow the port's rules."""

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        with self._lock:
            self._objects[key] = bytes(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        check_key(key)
        with self._lock:
            if key in self._objects:
                return False
            self._objects[key] = bytes(data)
            return True

    def get(self, key: str) -> bytes:
        check_key(key)
        with self._lock:
            try:
                return self._objects[key]
            except KeyError:
                raise ObjectNotFoundError(f"no object under {key!r}") from None

    def exists(self, key: str) -> bool:
        check_key(key)
        with self._lock:
            return key in self._objects

    def delete(self, key: str) -> None:
        check_key(key)
        with self._lock:
            self._objects.pop(key, None)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        with self._lock:
            keys = sorted(k for k in self._objects if k.startswith(prefix))
        return [k for k in keys if start_after is None or k > start_after]
