"""Reading and rearranging a run folder's checkpoint cuts the way a crash would leave them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
from rllm_core.run.checkpoints import RunCheckpoints
from rllm_core.run.cuts import CutRef
from rllm_core.types import Cut


def cut_names(checkpoints: Path) -> list[str]:
    """The complete cuts under a run's ``checkpoints/``, oldest first."""
    store = RunCheckpoints(checkpoints).store
    return sorted(k.split("/")[1] for k in store.list("cuts/") if k.endswith("/manifest.json"))


def point_latest_at(checkpoints: Path, step: int) -> None:
    """Make the cut of ``step`` the latest again, as if the run had stopped before the later
    ones were made latest."""
    store = RunCheckpoints(checkpoints).store
    (name,) = [n for n in cut_names(checkpoints) if int(n.split("-")[0]) == step]
    manifest = store.get(f"cuts/{name}/manifest.json")
    cut = msgspec.json.decode(manifest, type=Cut)
    ref = CutRef(
        name=name,
        step=cut.step,
        incarnation=cut.incarnation,
        trigger=cut.trigger,
        weight_version=cut.weight_version,
        manifest_sha256=hashlib.sha256(manifest).hexdigest(),
    )
    store.put("cuts/LATEST", msgspec.json.encode(ref))


def checkpoint_of(checkpoints: Path, step: int) -> Path:
    """The folder of the newest complete cut of ``step`` under a run's ``checkpoints/``."""
    names = [n for n in cut_names(checkpoints) if int(n.split("-")[0]) == step]
    assert names, f"no complete cut of step {step} under {checkpoints}: {cut_names(checkpoints)}"
    return checkpoints / "objects" / "cuts" / max(names, key=lambda n: int(n.split("-")[1]))


def cut_path(checkpoints: Path, step: int, incarnation: int = 1) -> Path:
    """Where the cut of ``step`` by the run's ``incarnation``-th process lies (complete once
    its ``manifest.json`` is there)."""
    return checkpoints / "objects" / "cuts" / f"{step:010d}-{incarnation:06d}"


def cut_steps(checkpoints: Path) -> list[int]:
    """The steps of the complete cuts under a run's ``checkpoints/``, ascending."""
    return sorted({int(n.split("-")[0]) for n in cut_names(checkpoints)})
