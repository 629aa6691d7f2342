"""Harbor task format 1.4: ``schema_version``, ``network_mode``, ``[task]``, the reward key,
and the refusals (newer schema versions, multi-step tasks, a separate verifier
environment)."""

from __future__ import annotations

import pytest
from rllm_core.errors import TaskFormatError
from rllm_core.types import NetworkPolicy
from rllm_task_source_harbor.plugin import HarborConfig
from rllm_task_source_harbor.reader import check_task, load_dataset, load_task
from rllm_task_source_harbor.source import HarborTaskSource
from rllm_task_source_harbor.task_toml import SCHEMA_VERSIONS
from task_sandbox import write_task

TOML_1_4 = """\
schema_version = "1.4"

[task]
name = "acme/count-lines"
version = "1.0.0"
description = "Count lines"

[metadata]
difficulty = "easy"

[verifier]
timeout_sec = 20
reward_key = "correctness"

[environment]
network_mode = "public"
"""


def problems_of(tmp_path, toml: str, **parts) -> list[tuple[str, str]]:
    check = check_task(write_task(tmp_path, "t", toml=toml, **parts))
    return [(p.field, p.message) for p in check.problems]


def test_a_1_4_task_is_read(tmp_path):
    task = load_task(write_task(tmp_path, "t", toml=TOML_1_4))
    assert task.metadata == {
        "version": "1.4",
        "package": {"name": "acme/count-lines", "version": "1.0.0", "description": "Count lines"},
        "difficulty": "easy",
    }
    assert task.data["reward_key"] == "correctness"
    assert task.data["reward_key_source"] == "task.toml [verifier]"
    assert task.environment.network == NetworkPolicy.FULL
    assert check_task(write_task(tmp_path, "u", toml=TOML_1_4)).warnings == []


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_understood_schema_version_reads(tmp_path, version):
    task = load_task(write_task(tmp_path, "t", toml=f'schema_version = "{version}"\n'))
    assert task.metadata["version"] == version


def test_the_older_version_key_still_reads_and_schema_version_wins(tmp_path):
    old = load_task(write_task(tmp_path, "old", toml='version = "1.0"\n'))
    assert old.metadata["version"] == "1.0"
    both = load_task(write_task(tmp_path, "both", toml='version = "1.0"\nschema_version = "1.4"\n'))
    assert both.metadata["version"] == "1.4"


@pytest.mark.parametrize("version", ["1.5", "2.0"])
def test_a_newer_schema_version_is_refused_naming_file_key_and_versions(tmp_path, version):
    task_dir = write_task(tmp_path, "t", toml=f'schema_version = "{version}"\n')
    with pytest.raises(TaskFormatError) as info:
        load_task(task_dir)
    assert str(info.value) == (
        f"t: schema_version: task.toml declares schema version '{version}', which this reader"
        " does not understand; it reads 1.0, 1.1, 1.2, 1.3, 1.4: write the task for 1.4 or"
        " upgrade rllm-task-source-harbor"
    )


def test_a_schema_version_that_is_not_a_string_is_a_problem(tmp_path):
    assert problems_of(tmp_path, "schema_version = 1.4\n") == [
        (
            "schema_version",
            "must be a string such as '1.4', got 1.4; task.toml versions understood:"
            " 1.0, 1.1, 1.2, 1.3, 1.4",
        )
    ]


@pytest.mark.parametrize(
    ("toml", "network"),
    [
        ('[environment]\nnetwork_mode = "public"\n', NetworkPolicy.FULL),
        ('[environment]\nnetwork_mode = "no-network"\n', NetworkPolicy.NONE),
        ('[environment]\nnetwork_mode = "no-network"\nallow_internet = true\n', NetworkPolicy.NONE),
        ('[environment]\nnetwork_mode = "public"\nallow_internet = false\n', NetworkPolicy.FULL),
        ("[environment]\nallow_internet = true\n", NetworkPolicy.FULL),
    ],
)
def test_network_mode_beats_allow_internet(tmp_path, toml, network):
    assert load_task(write_task(tmp_path, "t", toml=toml)).environment.network == network


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"allowlist"', "'allowlist' is not supported"),
        ('"open"', "must be 'no-network' or 'public', got 'open'"),
    ],
)
def test_unsupported_network_mode_is_a_problem(tmp_path, value, message):
    [(field, text)] = problems_of(tmp_path, f"[environment]\nnetwork_mode = {value}\n")
    assert field == "[environment].network_mode"
    assert message in text


def test_multi_step_tasks_are_refused(tmp_path):
    toml = '[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n'
    [(field, message)] = problems_of(tmp_path, toml)
    assert field == "steps"
    assert message.startswith("multi-step tasks are not supported")


SEPARATE = (
    "asks for a separate verifier environment ({image}), which this task source does not"
    " support: it runs tests/test.sh in the agent's sandbox only (environment_mode ="
    " 'shared'); remove the setting and install what the verifier needs in"
    " environment/Dockerfile"
)


def test_separate_verifier_with_tests_dockerfile_is_refused_naming_the_file(tmp_path):
    toml = '[verifier]\nenvironment_mode = "separate"\n'
    task_dir = write_task(tmp_path, "t", toml=toml, extra={"tests/Dockerfile": "FROM alpine\n"})
    with pytest.raises(TaskFormatError) as info:
        load_task(task_dir)
    image = f"its image built from {task_dir.resolve() / 'tests' / 'Dockerfile'}"
    assert [(p.task, p.field, p.message) for p in info.value.problems] == [
        ("t", "[verifier].environment_mode", SEPARATE.format(image=image))
    ]


def test_a_verifier_environment_table_implies_separate_and_is_refused(tmp_path):
    toml = '[verifier.environment]\ndocker_image = "acme/checker:1"\n'
    assert problems_of(tmp_path, toml) == [
        ("[verifier].environment", SEPARATE.format(image="its own image"))
    ]


def test_shared_mode_with_a_verifier_environment_is_a_conflict(tmp_path):
    toml = '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n'
    assert problems_of(tmp_path, toml) == [
        (
            "[verifier].environment",
            "is set but [verifier].environment_mode is 'shared'; remove one of them",
        )
    ]


def test_shared_mode_is_accepted_and_a_tests_dockerfile_only_warns(tmp_path):
    toml = '[verifier]\nenvironment_mode = "shared"\n'
    check = check_task(
        write_task(tmp_path, "t", toml=toml, extra={"tests/Dockerfile": "FROM alpine\n"})
    )
    assert check.ok
    assert check.warnings == [
        "t: tests/Dockerfile is only built for a separate verifier environment; the verifier"
        " runs in the agent's sandbox and the file is uploaded with tests/"
    ]


def test_a_bad_environment_mode_is_a_problem(tmp_path):
    assert problems_of(tmp_path, '[verifier]\nenvironment_mode = "both"\n') == [
        ("[verifier].environment_mode", "must be 'shared' or 'separate', got 'both'")
    ]


def test_the_task_sources_reward_key_overrides_every_tasks(tmp_path):
    write_task(tmp_path / "set", "a", toml=TOML_1_4)
    write_task(tmp_path / "set", "b")
    [a, b] = load_dataset(tmp_path / "set")
    assert (a.data["reward_key"], b.data["reward_key"]) == ("correctness", None)
    source = HarborTaskSource(HarborConfig(path=tmp_path / "set", reward_key="style"))
    assert {(t.data["reward_key"], t.data["reward_key_source"]) for t in source.tasks()} == {
        ("style", "the task source")
    }


def test_an_empty_reward_key_is_a_problem(tmp_path):
    assert problems_of(tmp_path, '[verifier]\nreward_key = " "\n') == [
        ("[verifier].reward_key", "must be a non-empty string, got ' '")
    ]
