"""Cuts and releases through an object store (rllm_core.run.cuts), on a dict store and the
fake trainer: layout, write order, digests, incarnations and pruning."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from reference.run_fakes import FakeTrainer
from rllm_core.errors import (
    CutDigestError,
    CutError,
    CutExistsError,
    CutNotFoundError,
    ObjectNotFoundError,
    StaleIncarnationError,
)
from rllm_core.ports import ObjectStore, WeightReleaser
from rllm_core.run.cuts import (
    ReleaseRef,
    claim_incarnation,
    latest_cut,
    latest_release,
    load_release,
    publish_release,
    restore_cut,
    write_cut,
)
from rllm_core.run.state import DataOrder, LoopState, capture_rngs

PREFIX = "runs/r1"


class DictStore:
    """The object store port over a dict; ``log`` records every write as (method, key)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.log: list[tuple[str, str]] = []

    def put(self, key: str, data: bytes) -> None:
        self.log.append(("put", key))
        self.objects[key] = bytes(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if key in self.objects:
            return False
        self.log.append(("put_if_absent", key))
        self.objects[key] = bytes(data)
        return True

    def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise ObjectNotFoundError(f"no object under {key!r}") from None

    def exists(self, key: str) -> bool:
        return key in self.objects

    def delete(self, key: str) -> None:
        self.log.append(("delete", key))
        self.objects.pop(key, None)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return sorted(
            key
            for key in self.objects
            if key.startswith(prefix) and (start_after is None or key > start_after)
        )

    def __repr__(self) -> str:
        return "DictStore()"


class ReleasingTrainer(FakeTrainer):
    """The fake trainer with weights: one file holding its weight version and model name."""

    def __init__(self, model: str = "tiny") -> None:
        super().__init__()
        self.model = model

    def save_weights(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "weights.json").write_text(json.dumps([self.model, self.weight_version]))

    def load_weights(self, path: str, version: int) -> None:
        model, _ = json.loads((Path(path) / "weights.json").read_text())
        if model != self.model:
            raise ValueError(f"weights of {model!r}, this backend runs {self.model!r}")
        self.weight_version = version


def loop_state(step: int, watermark: int) -> LoopState:
    data = DataOrder(size=5, seed=3)
    data.take(2)
    return LoopState(step=step, data=data, rngs=capture_rngs(), buffer_watermark=watermark)


def trained(steps: int) -> FakeTrainer:
    trainer = FakeTrainer()
    for _ in range(steps):
        trainer.optim_step()
    return trainer


def cut(store, trainer, step, *, incarnation=1, tmp_path, **options):
    return write_cut(
        store,
        PREFIX,
        trainer,
        loop_state(step, watermark=10 * step),
        trigger=options.pop("trigger", "scheduled"),
        incarnation=incarnation,
        workdir=tmp_path / "work",
        **options,
    )


def test_the_fakes_fit_the_ports():
    assert isinstance(DictStore(), ObjectStore)
    assert isinstance(ReleasingTrainer(), WeightReleaser)
    assert not isinstance(FakeTrainer(), WeightReleaser)


def test_a_cut_round_trips_trainer_and_loop_state(tmp_path):
    store = DictStore()
    state = loop_state(3, watermark=41)
    ref = write_cut(
        store,
        PREFIX,
        trained(3),
        state,
        trigger="preempt",
        incarnation=2,
        workdir=tmp_path / "work",
    )
    assert (ref.name, ref.step, ref.incarnation, ref.trigger, ref.weight_version) == (
        "0000000003-000002",
        3,
        2,
        "preempt",
        3,
    )
    assert latest_cut(store, PREFIX) == ref
    assert sorted(store.objects) == [
        "runs/r1/cuts/0000000003-000002/loop.json",
        "runs/r1/cuts/0000000003-000002/manifest.json",
        "runs/r1/cuts/0000000003-000002/trainer/version",
        "runs/r1/cuts/LATEST",
    ]
    manifest = json.loads(store.objects["runs/r1/cuts/0000000003-000002/manifest.json"])
    assert manifest["files"]["trainer/version"] == {
        "sha256": hashlib.sha256(b"3").hexdigest(),
        "size": 1,
    }
    assert (manifest["buffer_watermark"], manifest["weight_version"]) == (41, 3)
    assert list((tmp_path / "work").iterdir()) == []

    fresh = FakeTrainer()
    restored, restored_ref = restore_cut(store, PREFIX, fresh, tmp_path / "work")
    assert restored_ref == ref
    assert fresh.weight_version == 3
    assert restored.to_dict() == state.to_dict()
    assert restored.buffer_watermark == 41
    assert list((tmp_path / "work").iterdir()) == []


def test_objects_are_created_once_and_latest_is_written_last(tmp_path):
    store = DictStore()
    cut(store, trained(1), 1, tmp_path=tmp_path)
    ops = store.log
    assert ops[-1] == ("put", "runs/r1/cuts/LATEST")
    assert [op for op, _ in ops[:-1]] == ["put_if_absent"] * (len(ops) - 1)
    assert ops[-2] == ("put_if_absent", "runs/r1/cuts/0000000001-000001/manifest.json")


class FailingStore(DictStore):
    """Fails the first put of a key ending in ``fail_on``, as a crash there would."""

    def __init__(self, fail_on: str) -> None:
        super().__init__()
        self.fail_on = fail_on

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.fail_on and key.endswith(self.fail_on):
            self.fail_on = ""
            raise OSError(f"disk full writing {key}")
        return super().put_if_absent(key, data)


@pytest.mark.parametrize("fail_on", ["trainer/version", "loop.json", "manifest.json"])
def test_a_cut_broken_off_midway_never_becomes_latest(tmp_path, fail_on):
    store = FailingStore(fail_on="")
    first = cut(store, trained(1), 1, tmp_path=tmp_path)
    store.fail_on = fail_on
    with pytest.raises(OSError, match="disk full"):
        cut(store, trained(2), 2, tmp_path=tmp_path)
    assert latest_cut(store, PREFIX) == first
    fresh = FakeTrainer()
    state, ref = restore_cut(store, PREFIX, fresh, tmp_path / "work")
    assert (state.step, ref, fresh.weight_version) == (1, first, 1)


def test_a_second_writer_of_the_same_cut_fails_naming_it(tmp_path):
    store = DictStore()
    cut(store, trained(2), 2, tmp_path=tmp_path)
    with pytest.raises(CutExistsError) as caught:
        cut(store, trained(2), 2, tmp_path=tmp_path, trigger="final")
    assert caught.value.key == "runs/r1/cuts/0000000002-000001/manifest.json"
    assert "cut 0000000002-000001 is already complete" in str(caught.value)
    assert "claim_incarnation" in str(caught.value)


def test_a_writer_racing_another_mid_cut_fails_naming_the_object(tmp_path):
    store = DictStore()
    store.put_if_absent("runs/r1/cuts/0000000002-000001/loop.json", b"the other writer's")
    with pytest.raises(CutExistsError) as caught:
        cut(store, trained(2), 2, tmp_path=tmp_path)
    assert caught.value.key == "runs/r1/cuts/0000000002-000001/loop.json"
    assert store.objects["runs/r1/cuts/0000000002-000001/loop.json"] == b"the other writer's"
    assert latest_cut(store, PREFIX) is None


@pytest.mark.parametrize("damaged", ["trainer/version", "loop.json", "manifest.json"])
def test_a_damaged_object_is_refused_before_anything_loads(tmp_path, damaged):
    store = DictStore()
    cut(store, trained(2), 2, tmp_path=tmp_path)
    key = f"runs/r1/cuts/0000000002-000001/{damaged}"
    expected = hashlib.sha256(store.objects[key]).hexdigest()
    store.objects[key] += b" "
    fresh = FakeTrainer()
    with pytest.raises(CutDigestError) as caught:
        restore_cut(store, PREFIX, fresh, tmp_path / "work")
    error = caught.value
    assert (error.key, error.expected) == (key, expected)
    assert error.actual == hashlib.sha256(store.objects[key]).hexdigest()
    assert f"{key!r}" in str(error) and expected in str(error) and error.actual in str(error)
    assert "restore an older one" in str(error)
    assert fresh.weight_version == 0
    assert list((tmp_path / "work").iterdir()) == []


def test_a_missing_object_is_named(tmp_path):
    store = DictStore()
    cut(store, trained(2), 2, tmp_path=tmp_path)
    del store.objects["runs/r1/cuts/0000000002-000001/loop.json"]
    with pytest.raises(CutError, match=r"lists 'runs/r1/cuts/0000000002-000001/loop.json'"):
        restore_cut(store, PREFIX, FakeTrainer(), tmp_path / "work")


def test_an_older_cut_restores_by_its_ref(tmp_path):
    store = DictStore()
    older = cut(store, trained(1), 1, tmp_path=tmp_path)
    cut(store, trained(2), 2, tmp_path=tmp_path)
    fresh = FakeTrainer()
    state, ref = restore_cut(store, PREFIX, fresh, tmp_path / "work", ref=older)
    assert (state.step, state.buffer_watermark, fresh.weight_version, ref) == (1, 10, 1, older)


def test_no_cut_yet(tmp_path):
    store = DictStore()
    assert latest_cut(store, PREFIX) is None
    with pytest.raises(CutNotFoundError, match=r"no cut under prefix 'runs/r1'.*start the run"):
        restore_cut(store, PREFIX, FakeTrainer(), tmp_path)


def test_a_backend_that_does_not_restore_its_version_is_caught(tmp_path):
    class Forgetful(FakeTrainer):
        def load_state(self, path: str) -> None:
            pass

    store = DictStore()
    cut(store, trained(2), 2, tmp_path=tmp_path)
    with pytest.raises(CutError, match="holds weight version 2, but after load_state Forgetful"):
        restore_cut(store, PREFIX, Forgetful(), tmp_path / "work")


def test_an_unknown_trigger_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cut trigger 'hourly' is not one of scheduled"):
        cut(DictStore(), trained(1), 1, tmp_path=tmp_path, trigger="hourly")


def test_incarnations_are_claimed_once_each():
    store = DictStore()
    assert [claim_incarnation(store, PREFIX) for _ in range(3)] == [1, 2, 3]
    store.put_if_absent("runs/r1/incarnations/000005", b"{}")
    assert claim_incarnation(store, PREFIX) == 6
    assert claim_incarnation(store, "runs/other") == 1


def test_a_superseded_incarnation_cannot_move_latest(tmp_path):
    store = DictStore()
    newer = cut(store, trained(3), 3, incarnation=2, tmp_path=tmp_path)
    with pytest.raises(StaleIncarnationError) as caught:
        cut(store, trained(5), 5, incarnation=1, tmp_path=tmp_path)
    assert (caught.value.incarnation, caught.value.current) == (1, 2)
    assert "another trainer took over" in str(caught.value)
    assert latest_cut(store, PREFIX) == newer


def test_a_restarted_trainer_repeats_steps_without_colliding(tmp_path):
    store = DictStore()
    cut(store, trained(2), 2, incarnation=1, tmp_path=tmp_path)
    store.put_if_absent("runs/r1/cuts/0000000003-000001/loop.json", b"crashed mid-cut")
    again = cut(store, trained(3), 3, incarnation=2, tmp_path=tmp_path)
    assert latest_cut(store, PREFIX) == again
    assert again.name == "0000000003-000002"


def test_pruning_keeps_the_newest_and_clears_dead_leftovers(tmp_path):
    store = DictStore()
    for step in (1, 2, 3):
        cut(store, trained(step), step, incarnation=1, tmp_path=tmp_path)
    store.put_if_absent("runs/r1/cuts/0000000004-000001/loop.json", b"crashed mid-cut")
    # Rolled back: incarnation 2 restored step 1 and goes on from there.
    cut(store, trained(2), 2, incarnation=2, tmp_path=tmp_path, keep=2)
    names = {key.split("/")[3] for key in store.objects if not key.endswith("LATEST")}
    assert names == {"0000000003-000001", "0000000002-000002"}
    deleted = [key for op, key in store.log if op == "delete"]
    first_of_each = {}
    for key in deleted:
        first_of_each.setdefault(key.split("/")[3], key)
    assert first_of_each["0000000001-000001"].endswith("/manifest.json")
    assert first_of_each["0000000002-000001"].endswith("/manifest.json")
    assert latest_cut(store, PREFIX).name == "0000000002-000002"
    with pytest.raises(ValueError, match="keep=0"):
        cut(store, trained(3), 3, incarnation=2, tmp_path=tmp_path, keep=0)


# ---------------------------------------------------------------- releases


def test_a_release_round_trips_into_a_sampling_backend(tmp_path):
    store = DictStore()
    trainer = ReleasingTrainer()
    assert latest_release(store, PREFIX) is None
    for _ in range(2):
        trainer.optim_step()
        ref = publish_release(store, PREFIX, trainer, tmp_path / "work", incarnation=1)
    assert (ref.name, ref.version) == ("0000000002-000001", 2)
    assert latest_release(store, PREFIX) == ref
    assert store.log[-1] == ("put", "runs/r1/releases/LATEST")
    assert "runs/r1/releases/0000000002-000001/weights/weights.json" in store.objects
    sampler_side = ReleasingTrainer()
    assert load_release(store, PREFIX, sampler_side, tmp_path / "work") == 2
    assert sampler_side.weight_version == 2
    first = load_release(
        store, PREFIX, sampler_side, tmp_path / "work", ref=_ref_of(store, "0000000001-000001")
    )
    assert (first, sampler_side.weight_version) == (1, 1)
    assert list((tmp_path / "work").iterdir()) == []


def _ref_of(store: DictStore, name: str) -> ReleaseRef:
    manifest = store.objects[f"runs/r1/releases/{name}/manifest.json"]
    return ReleaseRef(
        name=name,
        version=int(name.split("-")[0]),
        incarnation=1,
        manifest_sha256=hashlib.sha256(manifest).hexdigest(),
    )


def test_a_damaged_release_is_refused(tmp_path):
    store = DictStore()
    trainer = ReleasingTrainer()
    trainer.optim_step()
    publish_release(store, PREFIX, trainer, tmp_path / "work", incarnation=1)
    key = "runs/r1/releases/0000000001-000001/weights/weights.json"
    store.objects[key] = store.objects[key].replace(b"1", b"7")
    sampler_side = ReleasingTrainer()
    with pytest.raises(CutDigestError) as caught:
        load_release(store, PREFIX, sampler_side, tmp_path / "work")
    assert caught.value.key == key
    assert sampler_side.weight_version == 0


def test_releases_need_a_weight_releaser(tmp_path):
    store = DictStore()
    with pytest.raises(TypeError, match="FakeTrainer cannot publish a release"):
        publish_release(store, PREFIX, FakeTrainer(), tmp_path, incarnation=1)
    with pytest.raises(CutNotFoundError, match="no release under prefix 'runs/r1'"):
        load_release(store, PREFIX, ReleasingTrainer(), tmp_path)


def test_releases_prune_and_refuse_a_second_publisher(tmp_path):
    store = DictStore()
    trainer = ReleasingTrainer()
    for _ in range(3):
        trainer.optim_step()
        publish_release(store, PREFIX, trainer, tmp_path / "work", incarnation=1, keep=1)
    assert {key.split("/")[3] for key in store.objects} == {"0000000003-000001", "LATEST"}
    with pytest.raises(CutExistsError, match="release 0000000003-000001 is already complete"):
        publish_release(store, PREFIX, trainer, tmp_path / "work", incarnation=1)
