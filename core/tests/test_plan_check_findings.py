"""``rllm-core plan check`` finds what a run would hit: missing files and folders of the shape a
component declares, models not pulled yet, credentials not set; each finding names the file,
the section and the key. Errors exit 2; warnings are printed and exit 0, or 2 with --strict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from rllm_core.cli import main
from rllm_core.plugins.specs import ComponentSpec, Credential, PlanPath

CREDENTIAL_VARS = (
    "TINKER_API_KEY",
    "TINKER_CREDENTIAL_CMD",
    "FIREWORKS_API_KEY",
    "MY_FIREWORKS_KEY",
    "MODAL_TOKEN_ID",
    "MODAL_TOKEN_SECRET",
    "DAYTONA_API_KEY",
    "DAYTONA_JWT_TOKEN",
    "WANDB_API_KEY",
)


@pytest.fixture(autouse=True)
def empty_caches(tmp_path, monkeypatch):
    """No model is cached, no credential is set, and the home folder holds no login file."""
    monkeypatch.setenv("RLLM_CORE_CACHE", str(tmp_path / "rllm-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)


def check(plan: Path, *args: str):
    return CliRunner().invoke(main, ["plan", "check", str(plan), *args])


def write(folder: Path, text: str) -> Path:
    path = folder / "plan.toml"
    path.write_text(text, encoding="utf-8")
    return path


TORCH = '[trainer]\nname = "torch"\nmodel = "smollm2-135m-instruct"\n'
PULL = "rllm-core models pull smollm2-135m-instruct"


def test_an_uncached_catalog_model_is_a_warning_naming_the_pull_command(tmp_path):
    plan = write(tmp_path, TORCH + '[renderer]\nname = "chatml"\n')
    done = check(plan)
    assert done.exit_code == 0, done.output
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    # the renderer's tokenizer, filled from the trainer's model, is not reported twice
    assert len(warnings) == 1, done.stderr
    assert f"{plan}: [trainer].model:" in warnings[0] and PULL in warnings[0]
    assert "plan ok" in done.stdout

    strict = check(plan, "--strict")
    assert strict.exit_code == 2
    assert "plan error (1 problem)" in strict.stderr and PULL in strict.stderr

    as_json = json.loads(check(plan, "--json").stdout)
    (warning,) = as_json["warnings"]
    assert as_json["ok"] is True and as_json["errors"] == []
    assert (warning["file"], warning["section"], warning["key"]) == (str(plan), "trainer", "model")
    assert warning["hint"] == f"run: {PULL}"


def test_a_missing_tokenizer_folder_is_an_error_naming_the_key(tmp_path):
    plan = write(tmp_path, TORCH + '[renderer]\nname = "chatml"\ntokenizer = "./tokenizers/x"\n')
    done = check(plan)
    assert done.exit_code == 2
    message = " ".join(done.stderr.split())
    assert (
        f"{plan}: [renderer].tokenizer: './tokenizers/x' (resolved to {tmp_path}/tokenizers/x)"
        " is not a folder" in message
    )
    assert "name a catalog model (smollm2-135m-instruct) or a Hub id" in message
    assert PULL in message  # the warnings are printed with the errors

    (tmp_path / "tokenizers" / "x").mkdir(parents=True)
    done = check(plan)
    assert done.exit_code == 2
    assert "[renderer].tokenizer:" in done.stderr
    assert "holds no tokenizer.json or tokenizer_config.json" in " ".join(done.stderr.split())


def test_a_folder_next_to_the_plan_is_not_taken_for_a_hub_id(tmp_path):
    (tmp_path / "models").mkdir()
    plan = write(tmp_path, TORCH + '[renderer]\nname = "qwen3"\ntokenizer = "models/Qwen3-8B"\n')
    done = check(plan, "--json")
    assert done.exit_code == 2
    (error,) = json.loads(done.stdout)["errors"]
    assert (error["section"], error["key"]) == ("renderer", "tokenizer")
    assert f"is not a folder (resolved to {tmp_path}/models/Qwen3-8B)" in error["message"]


def test_an_uncached_hub_id_is_a_warning_naming_the_pull_command(tmp_path):
    plan = write(tmp_path, TORCH + '[renderer]\nname = "qwen3"\ntokenizer = "Qwen/Qwen3-8B"\n')
    done = check(plan)
    assert done.exit_code == 0, done.output
    assert f"{plan}: [renderer].tokenizer: the Hub id 'Qwen/Qwen3-8B' is not in" in done.stderr
    assert "rllm-core models pull Qwen/Qwen3-8B" in done.stderr


def test_a_model_folder_needs_config_and_weights(tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    plan = write(tmp_path, '[trainer]\nname = "torch"\nmodel = "./my-model"\n')
    done = check(plan)
    assert done.exit_code == 2 and "[trainer].model:" in done.stderr
    assert "has no config.json" in " ".join(done.stderr.split())
    (model / "config.json").write_text("{}", encoding="utf-8")
    done = check(plan)
    assert done.exit_code == 2
    assert "holds config.json but no weights" in " ".join(done.stderr.split())


def test_missing_data_files_are_errors_naming_each_key(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    plan = write(
        tmp_path,
        '[tasks]\nname = "jsonl"\npath = "train.jsonl"\neval_path = "data/held-out.jsonl"\n',
    )
    done = check(plan, "--json")
    assert done.exit_code == 2
    payload = json.loads(done.stdout)
    (error,) = payload["errors"]
    assert (error["file"], error["section"], error["key"]) == (str(plan), "tasks", "eval_path")
    assert error["message"] == (
        f"'data/held-out.jsonl' (resolved to {tmp_path}/data/held-out.jsonl): no such file"
    )
    assert payload["issues"][0]["location"] == "[tasks].eval_path"

    plan.write_text('[tasks]\nname = "jsonl"\npath = "."\n', encoding="utf-8")
    done = check(plan)
    assert done.exit_code == 2 and "[tasks].path:" in done.stderr
    assert "is a folder, not a file" in done.stderr


def test_task_folders_must_hold_task_toml(tmp_path):
    tasks = tmp_path / "tasks"
    (tasks / "good").mkdir(parents=True)
    (tasks / "good" / "task.toml").write_text("", encoding="utf-8")
    (tasks / "stray").mkdir()
    (tasks / "_shared").mkdir()  # skipped, as the reader skips it
    plan = write(tmp_path, '[tasks]\nname = "harbor"\npath = "tasks"\n')
    done = check(plan)
    assert done.exit_code == 2
    message = " ".join(done.stderr.split())
    assert "[tasks].path: 'tasks' (resolved to" in message
    assert "these folders hold no task.toml: stray" in message
    (tasks / "stray" / "task.toml").write_text("", encoding="utf-8")
    assert check(plan).exit_code == 0

    plan.write_text(
        '[tasks]\nname = "harbor"\npath = "tasks"\nsplits = { hard = "tasks/good", odd = "x" }\n',
        encoding="utf-8",
    )
    (error,) = json.loads(check(plan, "--json").stdout)["errors"]
    assert (error["section"], error["key"]) == ("tasks", "splits.odd")
    assert error["message"] == f"'x' (resolved to {tmp_path}/x): no such folder"


def test_a_store_folder_need_not_exist(tmp_path):
    plan = write(tmp_path, '[trace_store]\nname = "deltachain"\npath = "not/yet"\n')
    done = check(plan)
    assert done.exit_code == 0, done.output
    assert "warning" not in done.stderr


def test_a_missing_credential_names_the_variable_to_set(tmp_path, monkeypatch):
    plan = write(tmp_path, '[sandbox]\nname = "modal"\n')
    done = check(plan, "--json")
    assert done.exit_code == 0, done.output
    (warning,) = json.loads(done.stdout)["warnings"]
    assert warning["section"] == "sandbox"
    assert "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET are not set" in warning["message"]
    assert "modal token set" in warning["hint"]
    assert check(plan, "--strict").exit_code == 2

    monkeypatch.setenv("MODAL_TOKEN_ID", "id")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "secret")
    assert json.loads(check(plan, "--json").stdout)["warnings"] == []
    monkeypatch.delenv("MODAL_TOKEN_SECRET")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".modal.toml").write_text("", encoding="utf-8")
    assert json.loads(check(plan, "--json").stdout)["warnings"] == []


def test_a_credential_a_plan_key_carries_or_renames(tmp_path, monkeypatch):
    plan = write(tmp_path, '[sandbox]\nname = "daytona"\napi_key = "dtn_x"\n')
    assert json.loads(check(plan, "--json").stdout)["warnings"] == []

    plan = write(
        tmp_path,
        '[trainer]\nname = "fireworks"\nmodel = "accounts/a/models/b"\n'
        'api_key_env = "MY_FIREWORKS_KEY"\n',
    )
    done = check(plan)
    assert done.exit_code == 0, done.output
    assert f"{plan}: [trainer].api_key_env:" in done.stderr
    assert "export MY_FIREWORKS_KEY=" in done.stderr
    monkeypatch.setenv("MY_FIREWORKS_KEY", "fw")
    assert "warning" not in check(plan).stderr


def test_wandb_needs_a_key_only_online(tmp_path):
    offline = write(tmp_path, '[[loggers]]\nname = "wandb"\n')
    assert "WANDB_API_KEY" not in check(offline).stderr
    online = write(tmp_path, '[[loggers]]\nname = "wandb"\nmode = "online"\n')
    done = check(online)
    assert done.exit_code == 0, done.output
    assert "[loggers[0]]:" in done.stderr and "WANDB_API_KEY is not set" in done.stderr


def test_plan_notes_are_warnings_and_errors_with_strict(tmp_path):
    plan = write(
        tmp_path, "[sampling]\ntemperature = 0.7\n" + TORCH + "logprob_temperature = 1.0\n"
    )
    payload = json.loads(check(plan, "--json").stdout)
    assert len(payload["notes"]) == 1
    note = next(w for w in payload["warnings"] if w["key"] == "logprob_temperature")
    assert note["section"] == "trainer" and note["message"].startswith("1.0 is replaced by")
    strict = check(plan, "--strict")
    assert strict.exit_code == 2 and "[trainer].logprob_temperature" in strict.stderr


class _Config(BaseModel):
    token: str | None = None


def test_a_credential_must_name_keys_the_config_has():
    with pytest.raises(ValueError, match=r"names keys its config lacks: \['api_key'\]"):
        ComponentSpec(
            kind="logger",
            name="x",
            factory=dict,
            summary="s",
            config=_Config,
            credentials=(Credential(what="key", env=("X",), key="api_key"),),
        )
    with pytest.raises(ValueError, match="expects 'folder'"):
        PlanPath(expects="folder")
