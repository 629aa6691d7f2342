"""The ``file`` object store: the conformance suite, the layout and the limits of a directory."""

from __future__ import annotations

import pytest
from rllm_core.errors import StorageError
from rllm_core.testing.suites.storage import ObjectStoreConformance
from rllm_object_store_file.objects import FileObjectStore


class TestFileObjectStore(ObjectStoreConformance):
    @pytest.fixture
    def object_store(self, tmp_path):
        return FileObjectStore(tmp_path / "store")

    @pytest.fixture
    def subprocess_factory_source(self):
        return (
            "from rllm_object_store_file.objects import FileObjectStore\n"
            "def open_store(location):\n"
            "    return FileObjectStore(location)\n"
        )


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_layout(tmp_path):
    store = FileObjectStore(tmp_path)
    store.put("runs/r1/cuts/000010.json", b'{"step": 10}')
    assert (tmp_path / "objects/runs/r1/cuts/000010.json").read_bytes() == b'{"step": 10}'
    assert _files(tmp_path) == ["objects/runs/r1/cuts/000010.json"]


def test_failed_conditional_put_leaves_no_temporary_file(tmp_path):
    store = FileObjectStore(tmp_path)
    assert store.put_if_absent("k", b"1") is True
    assert store.put_if_absent("k", b"2") is False
    assert _files(tmp_path) == ["objects/k"]
    assert store.get("k") == b"1"


def test_put_if_absent_never_replaces_the_file_it_finds(tmp_path):
    store = FileObjectStore(tmp_path)
    store.put("k", b"1")
    inode = (tmp_path / "objects/k").stat().st_ino
    assert store.put_if_absent("k", b"2") is False
    assert (tmp_path / "objects/k").stat().st_ino == inode


@pytest.mark.parametrize("key", ["a/./b", ".", "nul\x00here", "x" * 256, "a/" + "é" * 128])
def test_keys_a_directory_cannot_hold_are_refused(tmp_path, key):
    store = FileObjectStore(tmp_path)
    with pytest.raises(ValueError, match="invalid object key"):
        store.put(key, b"x")
    assert _files(tmp_path) == []


def test_longest_segment_is_accepted(tmp_path):
    store = FileObjectStore(tmp_path)
    store.put("x" * 255, b"x")
    assert store.list() == ["x" * 255]


def test_a_key_cannot_also_be_a_folder(tmp_path):
    store = FileObjectStore(tmp_path)
    store.put("a/b", b"1")
    with pytest.raises(StorageError, match="keys below 'a/' exist"):
        store.put("a", b"2")
    with pytest.raises(StorageError, match="keys below 'a/' exist"):
        store.put_if_absent("a", b"2")
    store.put("c", b"3")
    with pytest.raises(StorageError, match="'c' is an object"):
        store.put("c/d/e", b"4")
    with pytest.raises(StorageError, match="'c' is an object"):
        store.put_if_absent("c/d", b"4")
    assert store.list() == ["a/b", "c"]
    store.delete("a/b")
    store.put("a", b"5")
    assert store.get("a") == b"5"


def test_delete_removes_empty_folders(tmp_path):
    store = FileObjectStore(tmp_path)
    store.put("x/y/z/1", b"1")
    store.put("x/2", b"2")
    store.delete("x/y/z/1")
    assert not (tmp_path / "objects/x/y").exists()
    assert (tmp_path / "objects/x/2").is_file()


def test_delete_of_a_folder_is_a_no_op(tmp_path):
    store = FileObjectStore(tmp_path)
    store.put("x/y", b"1")
    store.delete("x")
    assert store.get("x/y") == b"1"


def test_list_never_leaves_the_store(tmp_path):
    (tmp_path / "secret.txt").write_bytes(b"outside")
    store = FileObjectStore(tmp_path / "store")
    store.put("a", b"1")
    assert store.list("../") == []
    assert store.list("/") == []
    assert store.list("a") == ["a"]


def test_two_instances_share_a_root(tmp_path):
    FileObjectStore(tmp_path).put("shared/key", b"value")
    assert FileObjectStore(tmp_path).get("shared/key") == b"value"


def test_accepts_any_bytes_like(tmp_path):
    store = FileObjectStore(tmp_path)
    store.put("m", memoryview(b"view"))
    store.put("b", bytearray(b"array"))
    assert (store.get("m"), store.get("b")) == (b"view", b"array")
