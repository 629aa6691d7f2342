"""Checkpoint cuts and policy releases, written through an :class:`~rllm_core.ports.ObjectStore`
so that a trainer on another machine, or the next process after a crash, can read them back.

Layout under ``prefix`` (``<cut>`` is ``<step:010d>-<incarnation:06d>``, ``<release>`` is
``<version:010d>-<incarnation:06d>``)::

    incarnations/<n:06d>            one object per trainer process, claimed on start
    cuts/<cut>/trainer/...          the files the backend's save_state wrote, one object each
    cuts/<cut>/loop.json            the LoopState (step, data order, generators, watermark)
    cuts/<cut>/manifest.json        a Cut: step, trigger, version, watermark, each file's digest
    cuts/LATEST                     a CutRef: the newest complete cut and its manifest's sha256
    releases/<release>/weights/...  the files the backend's save_weights wrote
    releases/<release>/manifest.json
    releases/LATEST                 a ReleaseRef

A cut's files are written first, its manifest next and ``LATEST`` last, each durable before
the next, so a reader that follows ``LATEST`` never meets a half-written cut; a crash in
between leaves objects that nothing names. Every object but ``LATEST`` is created with
``put_if_absent``: two writers of one cut cannot both succeed. The incarnation in the name
keeps a restarted trainer, which repeats the steps after its last cut, from colliding with
what its predecessor wrote past that cut. ``LATEST`` is refused to a process of an older
incarnation than the one it names, so a trainer that was replaced cannot move it back.
Readers check the manifest against the sha256 ``LATEST`` holds and every file against the
manifest before anything is loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TypeVar

import msgspec

from rllm_core.errors import (
    CutDigestError,
    CutError,
    CutExistsError,
    CutNotFoundError,
    ObjectNotFoundError,
    StaleIncarnationError,
)
from rllm_core.ports import ObjectStore, TrainerBackend, WeightReleaser
from rllm_core.run.state import LoopState
from rllm_core.types import Cut, CutTrigger, StoredFile

__all__ = [
    "CutRef",
    "Release",
    "ReleaseRef",
    "claim_incarnation",
    "latest_cut",
    "latest_release",
    "load_release",
    "publish_release",
    "restore_cut",
    "write_cut",
]

LATEST = "LATEST"
MANIFEST = "manifest.json"
LOOP_FILE = "loop.json"
TRAINER_DIR = "trainer"
WEIGHTS_DIR = "weights"
_NAME = re.compile(r"^(\d{10})-(\d{6})$")
_TRIGGERS = ("scheduled", "preempt", "manual", "final")

_T = TypeVar("_T")


class CutRef(msgspec.Struct, kw_only=True, frozen=True):
    """Names one complete cut: what ``cuts/LATEST`` holds and :func:`write_cut` returns."""

    name: str
    step: int
    incarnation: int
    trigger: CutTrigger
    weight_version: int
    manifest_sha256: str


class Release(msgspec.Struct, kw_only=True, frozen=True):
    """The manifest of one policy release: the weight version and each file's digest."""

    version: int
    incarnation: int
    created_at: float
    files: dict[str, StoredFile]


class ReleaseRef(msgspec.Struct, kw_only=True, frozen=True):
    """Names one complete release: what ``releases/LATEST`` holds."""

    name: str
    version: int
    incarnation: int
    manifest_sha256: str


# ---------------------------------------------------------------- incarnations


def claim_incarnation(store: ObjectStore, prefix: str) -> int:
    """A number no other trainer process under ``prefix`` holds: one more than the highest
    claimed so far (1 for the first), claimed with ``put_if_absent`` so that two processes
    starting together get different numbers."""
    root = _key(prefix, "incarnations")
    claimed = [int(key.rsplit("/", 1)[1]) for key in store.list(root + "/")]
    number = max(claimed, default=0) + 1
    while not store.put_if_absent(_key(root, f"{number:06d}"), _json({"claimed_at": time.time()})):
        number += 1
    return number


# ---------------------------------------------------------------- cuts


def write_cut(
    store: ObjectStore,
    prefix: str,
    trainer: TrainerBackend,
    state: LoopState,
    *,
    trigger: CutTrigger,
    incarnation: int,
    workdir: str | os.PathLike[str],
    keep: int | None = None,
) -> CutRef:
    """Write ``trainer``'s state and ``state`` as the cut of step ``state.step`` and make it
    ``LATEST``; returns its reference.

    The backend saves into a folder under ``workdir`` (removed afterwards). With ``keep``,
    complete cuts beyond the ``keep`` newest (by incarnation, then step) are deleted, and so
    are unfinished ones of older incarnations. Raises :class:`CutExistsError` when an object
    of this cut is already stored (another writer with the same incarnation),
    :class:`StaleIncarnationError` when ``LATEST`` names a newer incarnation (the cut is then
    written but not made ``LATEST``).
    """
    if trigger not in _TRIGGERS:
        raise ValueError(f"cut trigger {trigger!r} is not one of {', '.join(_TRIGGERS)}")
    _check_keep(keep)
    name = _name(state.step, incarnation)
    base = _key(prefix, "cuts", name)
    _refuse_existing(store, base, f"cut {name}")
    staging = _staging(workdir, f"cut-{name}")
    try:
        trainer.save_state(str(staging / TRAINER_DIR))
        (staging / LOOP_FILE).write_bytes(_json(state.to_dict()))
        files = _upload(store, base, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    cut = Cut(
        step=state.step,
        incarnation=incarnation,
        trigger=trigger,
        weight_version=trainer.weight_version,
        buffer_watermark=state.buffer_watermark,
        created_at=time.time(),
        files=files,
    )
    manifest = msgspec.json.encode(cut)
    _create(store, _key(base, MANIFEST), manifest)
    ref = CutRef(
        name=name,
        step=cut.step,
        incarnation=incarnation,
        trigger=trigger,
        weight_version=cut.weight_version,
        manifest_sha256=_sha256(manifest),
    )
    root = _key(prefix, "cuts")
    _advance_latest(store, _key(root, LATEST), ref, CutRef)
    if keep is not None:
        _prune(store, root, keep, ref.name)
    return ref


def latest_cut(store: ObjectStore, prefix: str) -> CutRef | None:
    """The cut ``cuts/LATEST`` names, or None when no cut was completed under ``prefix``."""
    return _read_latest(store, _key(prefix, "cuts", LATEST), CutRef)


def restore_cut(
    store: ObjectStore,
    prefix: str,
    trainer: TrainerBackend,
    workdir: str | os.PathLike[str],
    ref: CutRef | None = None,
) -> tuple[LoopState, CutRef]:
    """Load the cut ``ref`` (default: ``LATEST``) into ``trainer``; returns its loop state.

    Every object is checked against its digest before the backend's ``load_state`` sees it:
    :class:`CutDigestError` names the first that differs, :class:`CutError` a missing one or
    a backend that did not restore the cut's weight version, :class:`CutNotFoundError` a
    prefix without any cut.
    """
    if ref is None:
        ref = latest_cut(store, prefix)
        if ref is None:
            raise CutNotFoundError(
                f"no cut under {_where(store, prefix)}: {_key(prefix, 'cuts', LATEST)!r} does"
                " not exist; start the run from scratch, or point it at the prefix its"
                " earlier run wrote"
            )
    base = _key(prefix, "cuts", ref.name)
    cut = _read_manifest(store, base, ref.manifest_sha256, Cut, f"cut {ref.name}")
    staging = _staging(workdir, f"restore-{ref.name}")
    try:
        _download(store, base, cut.files, staging, f"cut {ref.name}")
        trainer.load_state(str(staging / TRAINER_DIR))
        loop = json.loads((staging / LOOP_FILE).read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if trainer.weight_version != cut.weight_version:
        raise CutError(
            f"cut {ref.name} holds weight version {cut.weight_version}, but after load_state"
            f" {type(trainer).__name__} reports {trainer.weight_version}; its load_state must"
            " restore the weight version (TrainerBackend contract)"
        )
    return LoopState.from_dict(loop), ref


# ---------------------------------------------------------------- releases


def publish_release(
    store: ObjectStore,
    prefix: str,
    trainer: WeightReleaser,
    workdir: str | os.PathLike[str],
    *,
    incarnation: int,
    keep: int | None = None,
) -> ReleaseRef:
    """Write ``trainer``'s weights of its current ``weight_version`` as a release and make it
    ``LATEST``; returns its reference.

    ``keep`` and the errors are those of :func:`write_cut`; a trainer without
    :class:`~rllm_core.ports.WeightReleaser` raises ``TypeError``.
    """
    _need_releaser(trainer, "publish a release")
    _check_keep(keep)
    version = int(trainer.weight_version)  # type: ignore[attr-defined]
    name = _name(version, incarnation)
    base = _key(prefix, "releases", name)
    _refuse_existing(store, base, f"release {name}")
    staging = _staging(workdir, f"release-{name}")
    try:
        trainer.save_weights(str(staging / WEIGHTS_DIR))
        files = _upload(store, base, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    release = Release(version=version, incarnation=incarnation, created_at=time.time(), files=files)
    manifest = msgspec.json.encode(release)
    _create(store, _key(base, MANIFEST), manifest)
    ref = ReleaseRef(
        name=name, version=version, incarnation=incarnation, manifest_sha256=_sha256(manifest)
    )
    root = _key(prefix, "releases")
    _advance_latest(store, _key(root, LATEST), ref, ReleaseRef)
    if keep is not None:
        _prune(store, root, keep, ref.name)
    return ref


def latest_release(store: ObjectStore, prefix: str) -> ReleaseRef | None:
    """The release ``releases/LATEST`` names, or None when none was published under
    ``prefix``."""
    return _read_latest(store, _key(prefix, "releases", LATEST), ReleaseRef)


def load_release(
    store: ObjectStore,
    prefix: str,
    backend: WeightReleaser,
    workdir: str | os.PathLike[str],
    ref: ReleaseRef | None = None,
) -> int:
    """Load the release ``ref`` (default: ``LATEST``) into ``backend``, whose sampler then
    tags what it samples with the release's version; returns that version.

    Digests are checked first, as in :func:`restore_cut`; the backend refuses weights of
    another model or shape.
    """
    _need_releaser(backend, "load a release")
    if ref is None:
        ref = latest_release(store, prefix)
        if ref is None:
            raise CutNotFoundError(
                f"no release under {_where(store, prefix)}:"
                f" {_key(prefix, 'releases', LATEST)!r} does not exist; wait for the trainer"
                " to publish one, or check that both sides use the same prefix"
            )
    base = _key(prefix, "releases", ref.name)
    release = _read_manifest(store, base, ref.manifest_sha256, Release, f"release {ref.name}")
    staging = _staging(workdir, f"load-{ref.name}")
    try:
        _download(store, base, release.files, staging, f"release {ref.name}")
        backend.load_weights(str(staging / WEIGHTS_DIR), release.version)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return release.version


# ---------------------------------------------------------------- shared steps


def _key(*parts: str) -> str:
    return "/".join(part.strip("/") for part in parts if part.strip("/"))


def _name(number: int, incarnation: int) -> str:
    if number < 0 or not 0 <= incarnation < 10**6:
        raise ValueError(
            f"step or version {number} and incarnation {incarnation} must be non-negative,"
            " the incarnation below 1000000; take it from claim_incarnation()"
        )
    return f"{number:010d}-{incarnation:06d}"


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _where(store: ObjectStore, prefix: str) -> str:
    return f"prefix {prefix!r} of {store!r}"


def _check_keep(keep: int | None) -> None:
    if keep is not None and keep < 1:
        raise ValueError(f"keep={keep} would delete the newest one too; pass 1 or more, or None")


def _need_releaser(backend: object, action: str) -> None:
    if not isinstance(backend, WeightReleaser):
        raise TypeError(
            f"{type(backend).__name__} cannot {action}: it has no save_weights/load_weights"
            " (rllm_core.ports.WeightReleaser); use a trainer backend that offers them"
        )


def _staging(workdir: str | os.PathLike[str], name: str) -> Path:
    folder = Path(workdir) / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _refuse_existing(store: ObjectStore, base: str, what: str) -> None:
    if store.exists(_key(base, MANIFEST)):
        raise CutExistsError(
            f"{what} is already complete at {_key(base, MANIFEST)!r} in {store!r}; another"
            " process with the same incarnation wrote it. Give each trainer process its own"
            " incarnation (claim_incarnation)",
            key=_key(base, MANIFEST),
        )


def _create(store: ObjectStore, key: str, data: bytes) -> None:
    if not store.put_if_absent(key, data):
        raise CutExistsError(
            f"{key!r} is already stored in {store!r}: another process is writing the same"
            " cut or release. Give each trainer process its own incarnation"
            " (claim_incarnation) and stop the other one",
            key=key,
        )


def _upload(store: ObjectStore, base: str, folder: Path) -> dict[str, StoredFile]:
    files: dict[str, StoredFile] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        _create(store, _key(base, relative), data)
        files[relative] = StoredFile(sha256=_sha256(data), size=len(data))
    return files


def _read_manifest(store: ObjectStore, base: str, sha256: str, kind: type[_T], what: str) -> _T:
    key = _key(base, MANIFEST)
    data = _get(store, key, what)
    _check_digest(store, key, data, sha256, None, what)
    return msgspec.json.decode(data, type=kind)


def _download(
    store: ObjectStore, base: str, files: dict[str, StoredFile], folder: Path, what: str
) -> None:
    for relative, expected in sorted(files.items()):
        key = _key(base, relative)
        data = _get(store, key, what)
        _check_digest(store, key, data, expected.sha256, expected.size, what)
        target = folder.joinpath(*relative.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _get(store: ObjectStore, key: str, what: str) -> bytes:
    try:
        return store.get(key)
    except ObjectNotFoundError:
        raise CutError(
            f"{what} lists {key!r}, but {store!r} holds no such object: the {what} is damaged;"
            " restore an older one (pass its ref) or start from scratch"
        ) from None


def _check_digest(
    store: ObjectStore, key: str, data: bytes, sha256: str, size: int | None, what: str
) -> None:
    actual = _sha256(data)
    if actual != sha256 or size not in (None, len(data)):
        size_note = "" if size is None else f" ({size} bytes)"
        raise CutDigestError(
            f"{key!r} in {store!r} does not hold the bytes {what} recorded: sha256 {sha256}"
            f"{size_note} expected, {actual} ({len(data)} bytes) found. The"
            f" object was changed or damaged after it was written; restore an older one (pass"
            " its ref) or start from scratch",
            key=key,
            expected=sha256,
            actual=actual,
        )


def _read_latest(store: ObjectStore, key: str, kind: type[_T]) -> _T | None:
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        return None
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise CutError(
            f"{key!r} in {store!r} is not a {kind.__name__} ({exc}); it was written by"
            " something else: remove it, or pass the ref to restore explicitly"
        ) from None


def _advance_latest(
    store: ObjectStore, key: str, ref: CutRef | ReleaseRef, kind: type[CutRef | ReleaseRef]
) -> None:
    current = _read_latest(store, key, kind)
    if current is not None and current.incarnation > ref.incarnation:
        raise StaleIncarnationError(
            f"{key!r} in {store!r} names {current.name} of incarnation {current.incarnation},"
            f" newer than this process's {ref.incarnation}: another trainer took over, so"
            f" {ref.name} was written but not made latest. Stop this process",
            incarnation=ref.incarnation,
            current=current.incarnation,
        )
    store.put(key, msgspec.json.encode(ref))


def _prune(store: ObjectStore, root: str, keep: int, latest: str) -> None:
    """Delete complete entries beyond the ``keep`` newest (never ``latest``), and unfinished
    ones that an older incarnation left; a manifest goes first, so a half-deleted entry is
    never complete."""
    incarnation = _order(latest)[0]
    complete: set[str] = set()
    seen: set[str] = set()
    for key in store.list(root + "/"):
        name, _, rest = key[len(root) + 1 :].partition("/")
        if _NAME.match(name):
            seen.add(name)
            if rest == MANIFEST:
                complete.add(name)
    newest_first = sorted(complete, key=_order, reverse=True)
    doomed = [name for name in newest_first[keep:] if name != latest] + [
        name for name in seen - complete if _order(name)[0] < incarnation
    ]
    for name in doomed:
        store.delete(_key(root, name, MANIFEST))
        for key in store.list(_key(root, name) + "/"):
            store.delete(key)


def _order(name: str) -> tuple[int, int]:
    """(incarnation, step or version) of an entry's name: newer incarnations come later."""
    number, incarnation = name.split("-")
    return int(incarnation), int(number)
