"""The torch backend on a tiny random Llama against the core's trainer backend conformance
suite, full and LoRA training; and the suite shown to reject backends that break the port's
rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rllm_core.algorithms.objective import Objective
from rllm_core.testing.suites.trainer_backends import (
    RecordingLoss,
    TrainerBackendConformance,
    make_trainer_datums,
)
from rllm_trainer_backend_torch import plugin
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.plugin import TorchBackendConfig

SPEC = next(spec for spec in plugin.rllm_trainer_backends() if spec.name == "torch")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(7, vocab_size=64, max_position_embeddings=32).save_pretrained(folder)
    return folder


def build(folder: Path, **keys: Any) -> Callable[[], TorchBackend]:
    config = TorchBackendConfig(model=str(folder), device="cpu", seed=0, **keys)
    return lambda: TorchBackend(config)


class TestTorchFull(TrainerBackendConformance):
    @pytest.fixture
    def build_trainer_backend(self, tiny_model_dir: Path) -> Callable[[], TorchBackend]:
        return build(tiny_model_dir, lora={"rank": 0}, micro_batch_size=2)

    @pytest.fixture
    def trainer_backend_spec(self):
        return SPEC


class TestTorchLora(TrainerBackendConformance):
    @pytest.fixture
    def build_trainer_backend(self, tiny_model_dir: Path) -> Callable[[], TorchBackend]:
        return build(tiny_model_dir, lora={"rank": 4, "alpha": 8})

    @pytest.fixture
    def trainer_backend_spec(self):
        return SPEC


# ------------------------------------------------------------------ the suite rejects breakage

SUITE = TrainerBackendConformance()


class Broken(TorchBackend):
    """Breaks nothing until a subclass does."""


class CountsEveryCall(Broken):
    """Publishes a version per forward_backward call instead of per optimizer step."""

    def forward_backward(self, datums, objective):
        metrics = super().forward_backward(datums, objective)
        with self.gate.exclusive():
            self.gate.publish()
        return metrics


class ForgetsTheVersion(Broken):
    def load_state(self, path):
        version = self.weight_version
        super().load_state(path)
        self.gate.set_version(version)


class DropsTheOptimizer(Broken):
    """Restores the weights but starts a fresh optimizer: resuming does not continue the run."""

    def load_state(self, path):
        super().load_state(path)
        self.optimizer.state.clear()


class ShiftedAdvantages(Broken):
    def forward_backward(self, datums, objective):
        from msgspec.structs import replace

        shifted = [replace(d, advantages=[a + 1.0 for a in d.advantages]) for d in datums]
        return super().forward_backward(shifted, objective)


class IntegerCounts(Broken):
    def forward_backward(self, datums, objective):
        metrics = super().forward_backward(datums, objective)
        metrics["sequences"] = len(datums)
        return metrics


class Unprefixed(Broken):
    def forward_backward(self, datums, objective):
        return super().forward_backward(datums, objective) | {"peak_memory": 1.0}


class TrainsAfterClose(Broken):
    def close(self):
        pass


@pytest.fixture
def broken(tiny_model_dir: Path) -> Callable[[type[TorchBackend]], Callable[[], Any]]:
    made: list[TorchBackend] = []

    def of(cls: type[TorchBackend]) -> Callable[[], Any]:
        config = TorchBackendConfig(model=str(tiny_model_dir), device="cpu", lora={"rank": 0})

        def new() -> TorchBackend:
            made.append(cls(config))
            return made[-1]

        return new

    yield of
    for backend in made:
        TorchBackend.close(backend)


def datums():
    return make_trainer_datums(0), make_trainer_datums(1, (6, 8))


def test_catches_a_version_per_forward_backward(broken) -> None:
    with pytest.raises(AssertionError, match=r"after 1 optimizer steps .* weight_version is 2"):
        SUITE.test_optim_step_publishes_one_new_version(broken(CountsEveryCall), datums(), None)


def test_catches_a_load_that_keeps_the_current_version(broken, tmp_path) -> None:
    with pytest.raises(AssertionError, match="saved at version 1 left weight_version at 3"):
        SUITE.test_save_load_continues_as_if_never_stopped(
            broken(ForgetsTheVersion), datums(), tmp_path
        )


def test_catches_a_resume_that_does_not_continue_the_run(broken, tmp_path) -> None:
    with pytest.raises(
        AssertionError, match=r"reloaded in place: b/.*loss is .*, the run that never stopped"
    ):
        SUITE.test_save_load_continues_as_if_never_stopped(
            broken(DropsTheOptimizer), datums(), tmp_path
        )


def test_catches_losses_that_see_other_values(broken) -> None:
    with pytest.raises(AssertionError, match="did not see the datums' advantages"):
        SUITE.test_forward_backward_evaluates_the_objective_on_the_datums(
            broken(ShiftedAdvantages), datums(), SPEC
        )


def test_catches_integer_metrics(broken) -> None:
    with pytest.raises(AssertionError, match="metric 'sequences' is int"):
        SUITE.test_forward_backward_evaluates_the_objective_on_the_datums(
            broken(IntegerCounts), datums(), SPEC
        )


def test_catches_an_unprefixed_backend_metric(broken) -> None:
    with pytest.raises(AssertionError, match="'peak_memory' is neither the objective's nor"):
        SUITE.test_forward_backward_evaluates_the_objective_on_the_datums(
            broken(Unprefixed), datums(), SPEC
        )


def test_catches_a_backend_that_trains_after_close(broken) -> None:
    with pytest.raises(pytest.fail.Exception, match="a closed backend trained on"):
        SUITE.test_close_twice_and_refuse_work_after(broken(TrainsAfterClose), datums())


def test_the_recording_loss_sees_every_action_token_of_every_micro_batch(tiny_model_dir) -> None:
    backend = build(tiny_model_dir, lora={"rank": 0}, micro_batch_size=1)()
    try:
        loss = RecordingLoss()
        first, _ = datums()
        backend.forward_backward(first, Objective.of(loss, name=loss.name))
        assert len(loss.contexts) == len(first)
        assert len(loss.seen("advantages")) == sum(sum(d.action_mask) for d in first)
    finally:
        backend.close()
