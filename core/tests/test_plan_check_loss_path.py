"""``plan check`` refuses ``[trainer].loss_path = "native"`` when the plan's objective has no
server-side kernel on the trainer backend: a loss without one, an auxiliary loss, a rollout
correction, recomputed proximal logprobs, or a kernel the backend does not list. The error
names ``[trainer].loss_path``, says why and what to do; ``auto`` and ``custom`` never fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict
from rllm_core import ComponentSpec, hookimpl
from rllm_core.cli import main
from rllm_core.errors import PlanError
from rllm_core.plan.load import parse_plan
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plugins import PluginManager

CREDENTIAL_VARS = ("TINKER_API_KEY", "TINKER_CREDENTIAL_CMD")


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    loss_path: Literal["auto", "native", "custom"] = "auto"


class ServicePlugin:
    """A trainer backend ``svc`` whose service runs the ``ppo`` and ``importance_sampling``
    kernels (not ``cispo``) and recomputes proximal logprobs."""

    @hookimpl
    def rllm_trainer_backends(self):
        yield ComponentSpec(
            kind="trainer_backend",
            name="svc",
            factory=lambda config: None,
            config=ServiceConfig,
            summary="a service with fused loss kernels",
            traits={
                "native_losses": ("importance_sampling", "ppo"),
                "proximal_modes": ("rollout", "recompute"),
            },
        )


@pytest.fixture(scope="module")
def manager() -> PluginManager:
    manager = PluginManager()
    manager.register(ServicePlugin(), name="svc-test")
    return manager


def resolve(manager: PluginManager, *, loss_path: str = "native", **algorithm: Any):
    data = {
        "algorithm": {"loss": "ppo-clip", "advantage": "grpo"} | algorithm,
        "trainer": {"name": "svc", "loss_path": loss_path},
    }
    return resolve_plan(parse_plan(data), manager=manager, path="plan.toml")


def refusal(manager: PluginManager, **options: Any) -> str:
    with pytest.raises(PlanError) as caught:
        resolve(manager, **options)
    (issue,) = caught.value.issues
    assert (issue.section, issue.key, issue.value) == ("trainer", "loss_path", "native")
    assert issue.hint.startswith('set loss_path = "auto" or "custom", or use a loss with a')
    # the hint lists the installed losses the service runs natively, and only those
    assert "ppo-clip ('ppo')" in issue.hint and "reinforce ('importance_sampling')" in issue.hint
    assert "cispo" not in issue.hint and "gspo" not in issue.hint
    return issue.message


def test_a_loss_with_a_listed_kernel_passes(manager):
    assert resolve(manager).get("[trainer]").config.loss_path == "native"
    resolve(manager, loss="reinforce")
    resolve(manager, loss={"name": "ppo-clip", "eps_high": 0.28})


@pytest.mark.parametrize(
    ("algorithm", "reason"),
    [
        ({"loss": "gspo"}, "loss 'gspo': the services' SDKs list a 'gspo' kernel"),
        ({"loss": {"name": "ppo-clip", "dual_clip_c": 3.0}}, "dual_clip_c has no parameter"),
        ({"loss": "dppo-tv"}, "loss 'dppo-tv' declares no server-side form"),
        ({"loss": "cispo"}, "runs as the 'cispo' kernel, which the installed svc SDK does not"),
        (
            {"aux_losses": [{"name": "echo", "coef": 0.1}]},
            "auxiliary loss 'echo' has no server-side kernel",
        ),
        ({"correction": {"tis_cap": 2.0}}, "rollout correction tis_cap weighs tokens"),
        (
            {"correction": {"mask_low": 0.5, "mask_high": 2.0}},
            "rollout correction mask_low/mask_high weighs tokens",
        ),
        ({"proximal": "recompute"}, "proximal = 'recompute'; the service's kernels take"),
    ],
)
def test_an_objective_without_a_kernel_is_refused_with_the_reason(manager, algorithm, reason):
    message = refusal(manager, **algorithm)
    assert message.startswith("loss_path = 'native', but svc cannot run this objective")
    assert reason in message


def test_an_auxiliary_loss_with_coefficient_zero_is_not_trained_so_it_passes(manager):
    resolve(manager, aux_losses=[{"name": "echo", "coef": 0.0}])


@pytest.mark.parametrize("loss_path", ["auto", "custom"])
def test_auto_and_custom_never_refuse(manager, loss_path):
    resolve(manager, loss_path=loss_path, loss="gspo", correction={"tis_cap": 2.0})


# ------------------------------------------------------------------ rllm-core plan check


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLLM_CORE_CACHE", str(tmp_path / "rllm-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)


def tinker_plan(folder: Path, loss: str, extra: str = "") -> Path:
    path = folder / "plan.toml"
    path.write_text(
        f'[algorithm]\nloss = "{loss}"\nadvantage = "grpo"\n{extra}\n'
        "[sampling]\ntemperature = 1.0\n\n"
        '[trainer]\nname = "tinker"\nmodel = "Qwen/Qwen3-8B"\nloss_path = "native"\n',
        encoding="utf-8",
    )
    return path


def check(plan: Path):
    return CliRunner().invoke(main, ["plan", "check", str(plan), "--json"])


@pytest.mark.usefixtures("no_credentials")
def test_plan_check_refuses_gspo_natively_on_tinker(tmp_path):
    done = check(tinker_plan(tmp_path, "gspo"))
    assert done.exit_code == 2, done.output
    (error,) = json.loads(done.stdout)["errors"]
    assert (error["section"], error["key"]) == ("trainer", "loss_path")
    assert "tinker cannot run this objective in its own kernel: loss 'gspo'" in error["message"]
    assert "ppo-clip ('ppo')" in error["hint"]


@pytest.mark.usefixtures("no_credentials")
def test_plan_check_passes_ppo_clip_natively_on_tinker(tmp_path):
    done = check(tinker_plan(tmp_path, "ppo-clip"))
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["errors"] == []
    # only the credential is missing, which is a warning
    assert {(w["section"], w["key"]) for w in report["warnings"]} <= {("trainer", None)}


@pytest.mark.usefixtures("no_credentials")
def test_plan_check_refuses_ppo_clip_with_an_auxiliary_loss_natively_on_tinker(tmp_path):
    plan = tinker_plan(tmp_path, "ppo-clip", 'aux_losses = [{ name = "echo", coef = 0.05 }]\n')
    done = check(plan)
    assert done.exit_code == 2, done.output
    (error,) = json.loads(done.stdout)["errors"]
    assert (error["section"], error["key"]) == ("trainer", "loss_path")
    assert "auxiliary loss 'echo' has no server-side kernel" in error["message"]

    plain = CliRunner().invoke(main, ["plan", "check", str(plan)])
    assert plain.exit_code == 2
    assert f"{plan}: [trainer].loss_path: loss_path = 'native'" in plain.stderr
