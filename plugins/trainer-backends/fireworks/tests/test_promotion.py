"""promote_final: the final weights become a permanent Fireworks model before the job is torn
down, the run log names it, and a failed promotion still tears the job down."""

from __future__ import annotations

import logging

import pytest
from fake_fireworks import CONFIG, FakeService
from reference.service_faults import DATUMS, Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_trainer_backend_fireworks.backend import FireworksBackend
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig


def trained(service: FakeService, **config: object) -> FireworksBackend:
    backend = FireworksBackend(CONFIG.model_copy(update=config), service=service)
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    backend.optim_step()
    return backend


def test_close_promotes_the_final_weights_before_the_job_is_torn_down(caplog):
    service = FakeService()
    backend = trained(service, promote_final=True, promoted_model_id="qwen3-8b-rl")
    with caplog.at_level(logging.WARNING):
        backend.close()
    ((snapshot, kind, steps),) = service.training.final_saves
    assert (snapshot, kind, steps) == ("rllm-final-step1-a1b2c3d4", "base", 1)
    assert service.promoted == [
        ("job-7f3a", snapshot, "qwen3-8b-rl", "accounts/fireworks/models/qwen3-8b")
    ]
    assert backend.promoted_model == "accounts/acme/models/qwen3-8b-rl"
    assert service.closed
    (record,) = [r for r in caplog.records if "promoted the final weights" in r.message]
    assert record.levelno == logging.WARNING
    assert "accounts/acme/models/qwen3-8b-rl" in record.message and "job-7f3a" in record.message


def test_the_default_model_id_names_the_job_and_the_step():
    service = FakeService(trainer_job_id="accounts/acme/rlorTrainerJobs/Job_7F3A")
    backend = trained(service, promote_final=True)
    backend.close()
    assert service.promoted[0][2] == "rllm-job-7f3a-step1"


def test_nothing_is_promoted_without_the_key_or_without_a_step():
    service = FakeService()
    trained(service).close()
    FireworksBackend(CONFIG.model_copy(update={"promote_final": True}), service=service).close()
    assert service.promoted == [] and service.training.final_saves == []


def test_a_failed_promotion_is_logged_and_the_job_still_torn_down(caplog):
    service = FakeService(models={"taken"})
    backend = trained(service, promote_final=True, promoted_model_id="taken")
    with caplog.at_level(logging.ERROR):
        backend.close()
    assert service.closed and backend.promoted_model is None
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "409 exists" in record.message and "promoted_model_id" in record.message


def test_the_model_id_is_checked_by_the_plan():
    with pytest.raises(ValueError, match="promoted_model_id"):
        FireworksBackendConfig(model="m", promoted_model_id="Not_Valid")
