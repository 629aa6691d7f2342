"""Reading Harbor task directories: every task.toml field, defaults, problems, datasets."""

from __future__ import annotations

import logging
import textwrap

import pytest
from rllm_core.errors import TaskFormatError, TaskProblem
from rllm_core.types import NetworkPolicy, SandboxSpec, Task
from rllm_task_source_harbor.reader import check_dataset, check_task, load_dataset, load_task
from task_sandbox import GOOD_DOCKERFILE, write_task


def runs(task: Task) -> list[str]:
    """The replayed RUN steps of ``task``, in order."""
    return [step["run"] for step in task.data["setup_steps"] if "run" in step]


FULL_TOML = """\
version = "1.0"

[metadata]
author_name = "Ada"
author_email = "ada@example.org"
difficulty = "hard"
category = "text"
tags = ["awk", "csv"]

[verifier]
timeout_sec = 45.5
user = "checker"
env = { STRICT = "1", LEVEL = 3, FAST = true }

[agent]
timeout_sec = 300
user = "agent"

[solution]
env = { HINT = "none" }

[environment]
build_timeout_sec = 90
cpus = 2
memory = "1.5G"
storage = "4GiB"
gpus = 1
allow_internet = true
env = { MODE = "test", GREETING = "override" }
"""

CONTEXT = {"environment/data.csv": "a,b\n"}
FULL_DOCKERFILE = """\
FROM python:3.12-slim
ENV GREETING=hi LANGUAGE=en
WORKDIR /srv
RUN echo one > a.txt
COPY data.csv /srv/
RUN echo two \\
    > b.txt
"""


def test_every_field_is_read(tmp_path):
    task_dir = write_task(
        tmp_path, "full", toml=FULL_TOML, dockerfile=FULL_DOCKERFILE, extra=CONTEXT
    )
    task = load_task(task_dir)
    assert task.task_id == "full"
    assert task.source == "harbor"
    assert task.instruction == "Write done to output.txt.\n"
    assert task.agent_timeout_s == 300.0
    assert task.verifier_timeout_s == 45.5
    assert task.environment == SandboxSpec(
        image="python:3.12-slim",
        dockerfile=FULL_DOCKERFILE,
        replays_dockerfile=True,
        context_dir=str(task_dir.resolve() / "environment"),
        workdir="/srv",
        cpu=2.0,
        memory_mb=1536,
        disk_mb=4096,
        lifetime_s=300 + 45.5 + 90,
        env={"GREETING": "override", "LANGUAGE": "en", "MODE": "test"},
        user="agent",
        network=NetworkPolicy.FULL,
    )
    assert task.data == {
        "task_dir": str(task_dir.resolve()),
        "verifier_user": "checker",
        "reward_key": None,
        "reward_key_source": "task.toml [verifier]",
        "agent_user": "agent",
        "setup_steps": [
            {"run": "mkdir -p /srv && cd /srv && echo one > a.txt", "line": 4},
            {
                "copy": {
                    "keyword": "COPY",
                    "sources": ["data.csv"],
                    "dest": "/srv",
                    "into_directory": True,
                    "line": 5,
                },
                "line": 5,
            },
            {"run": "mkdir -p /srv && cd /srv && echo two > b.txt", "line": 6},
        ],
        "context_dir": str(task_dir.resolve() / "environment"),
        "healthcheck": None,
        "replay_dockerfile": True,
        "build_timeout_s": 90.0,
        "verifier_env": {"STRICT": "1", "LEVEL": "3", "FAST": "true"},
        "solution_env": {"HINT": "none"},
        "has_solution": True,
        "gpus": 1,
    }
    assert task.metadata == {
        "version": "1.0",
        "author_name": "Ada",
        "author_email": "ada@example.org",
        "difficulty": "hard",
        "category": "text",
        "tags": ["awk", "csv"],
    }


def test_defaults_for_a_minimal_task(tmp_path):
    task_dir = write_task(tmp_path, "minimal", toml="", dockerfile="FROM alpine:3\n", solve_sh=None)
    task = load_task(task_dir)
    assert task.agent_timeout_s == 600.0
    assert task.verifier_timeout_s == 600.0
    assert task.environment == SandboxSpec(
        image="alpine:3",
        dockerfile="FROM alpine:3\n",
        replays_dockerfile=True,
        context_dir=str(task_dir.resolve() / "environment"),
        workdir="/workspace",
        lifetime_s=1200.0,
        network=NetworkPolicy.NONE,
    )
    assert runs(task) == []
    assert task.data["replay_dockerfile"] is True
    assert task.data["verifier_user"] is None
    assert task.data["has_solution"] is False
    assert task.metadata == {"version": ""}


def test_memory_mb_and_storage_mb_as_plain_numbers(tmp_path):
    toml = "[environment]\nmemory_mb = 3072\nstorage_mb = 20480\ncpus = 0.5\n"
    spec = load_task(write_task(tmp_path, toml=toml)).environment
    assert (spec.memory_mb, spec.disk_mb, spec.cpu) == (3072, 20480, 0.5)


def test_workdir_from_task_toml_beats_the_dockerfile(tmp_path):
    toml = '[environment]\nworkdir = "/workspace/project"\n'
    assert load_task(write_task(tmp_path, toml=toml)).environment.workdir == "/workspace/project"


def test_docker_image_turns_replay_off_and_needs_no_dockerfile(tmp_path):
    toml = '[environment]\ndocker_image = "ghcr.io/acme/task:1"\n'
    task = load_task(write_task(tmp_path, toml=toml, dockerfile=None))
    assert task.environment.image == "ghcr.io/acme/task:1"
    assert task.environment.dockerfile is None
    assert runs(task) == []
    assert task.data["replay_dockerfile"] is False
    assert task.environment.lifetime_s == 600 + 600


def test_docker_image_with_dockerfile_keeps_its_workdir_but_not_its_steps(tmp_path):
    toml = '[environment]\ndocker_image = "acme/prebuilt"\n'
    task = load_task(write_task(tmp_path, toml=toml, dockerfile=FULL_DOCKERFILE, extra=CONTEXT))
    assert task.environment.image == "acme/prebuilt"
    assert task.environment.replays_dockerfile is False
    assert task.environment.workdir == "/srv"
    assert task.environment.env == {}
    assert runs(task) == []


def test_replay_toggle_overrides_the_default(tmp_path):
    toml = '[environment]\ndocker_image = "acme/prebuilt"\n'
    on = load_task(write_task(tmp_path, "on", toml=toml), replay_dockerfile=True)
    assert runs(on) == ["mkdir -p /app && cd /app && printf 'a\\nb\\n' > input.txt"]
    off = load_task(write_task(tmp_path, "off"), replay_dockerfile=False)
    assert runs(off) == []
    assert off.data["replay_dockerfile"] is False
    assert off.environment.image == "debian:bookworm-slim"
    # Only a FROM image with the rest replayed may be traded for the real build.
    assert (on.environment.replays_dockerfile, off.environment.replays_dockerfile) == (False, False)


def test_forced_replay_without_a_dockerfile_is_a_problem(tmp_path):
    toml = '[environment]\ndocker_image = "acme/prebuilt"\n'
    task_dir = write_task(tmp_path, toml=toml, dockerfile=None)
    with pytest.raises(TaskFormatError) as info:
        load_task(task_dir, replay_dockerfile=True)
    assert [p.field for p in info.value.problems] == ["environment/Dockerfile"]


def test_verifier_user_override(tmp_path):
    task = load_task(write_task(tmp_path, toml=FULL_TOML), verifier_user="root")
    assert task.data["verifier_user"] == "root"


@pytest.mark.parametrize(
    ("toml", "field", "message"),
    [
        ("[agent]\ntimeout_sec = 'long'\n", "[agent].timeout_sec", "must be a number"),
        ("[agent]\ntimeout_sec = 0\n", "[agent].timeout_sec", "must be positive"),
        ("[verifier]\ntimeout_sec = -1\n", "[verifier].timeout_sec", "must be positive"),
        ("[verifier]\ntimeout_sec = true\n", "[verifier].timeout_sec", "must be a number"),
        (
            "[environment]\nbuild_timeout_sec = 'x'\n",
            "[environment].build_timeout_sec",
            "must be a number",
        ),
        ("[environment]\ncpus = 0\n", "[environment].cpus", "positive number of cores"),
        ("[environment]\ncpus = '2'\n", "[environment].cpus", "positive number of cores"),
        ("[environment]\nmemory = '4X'\n", "[environment].memory", "unknown unit"),
        ("[environment]\nmemory_mb = 0\n", "[environment].memory_mb", "not a positive size"),
        ("[environment]\nstorage = 'big'\n", "[environment].storage", "is not a size"),
        ("[environment]\nstorage_mb = -2\n", "[environment].storage_mb", "positive size"),
        (
            "[environment]\nmemory = '1G'\nmemory_mb = 1024\n",
            "[environment].memory",
            "both memory and memory_mb are set",
        ),
        ("[environment]\ngpus = 1.5\n", "[environment].gpus", "whole number"),
        ("[environment]\nallow_internet = 'yes'\n", "[environment].allow_internet", "true or"),
        ("[environment]\ndocker_image = ''\n", "[environment].docker_image", "non-empty"),
        ("[environment]\nworkdir = 'app'\n", "[environment].workdir", "absolute path"),
        ("[environment]\nenv = { A = [1] }\n", "[environment].env.A", "string or number"),
        ("[environment]\nenv = 'A=1'\n", "[environment].env", "table of NAME = value"),
        ("[verifier]\nuser = 5\n", "[verifier].user", "non-empty string"),
        ("[agent]\nuser = ''\n", "[agent].user", "non-empty string"),
        ("[solution]\nenv = { X = {} }\n", "[solution].env.X", "string or number"),
        ("version = 1\n", "version", "must be a string"),
        ("[metadata]\ntags = 'a'\n", "[metadata].tags", "list of strings"),
        ("[metadata]\ndifficulty = 3\n", "[metadata].difficulty", "must be a string"),
        ("agent = 5\n", "[agent]", "must be a table"),
        ("[agent\n", "task.toml", "is not valid TOML"),
    ],
)
def test_bad_field_is_a_problem_naming_task_and_field(tmp_path, toml, field, message):
    task_dir = write_task(tmp_path, "bad-task", toml=toml)
    with pytest.raises(TaskFormatError) as info:
        load_task(task_dir)
    problems = info.value.problems
    assert [(p.task, p.field) for p in problems] == [("bad-task", field)]
    assert message in problems[0].message
    assert f"bad-task: {field}: " in str(info.value)


@pytest.mark.parametrize(
    ("part", "field"),
    [
        ("task.toml", "task.toml"),
        ("instruction.md", "instruction.md"),
        ("tests/test.sh", "tests/test.sh"),
        ("environment/Dockerfile", "environment/Dockerfile"),
    ],
)
def test_missing_required_file_is_a_problem(tmp_path, part, field):
    task_dir = write_task(tmp_path, "t")
    (task_dir / part).unlink()
    with pytest.raises(TaskFormatError) as info:
        load_task(task_dir)
    assert [p.field for p in info.value.problems] == [field]
    assert "missing" in info.value.problems[0].message


def test_empty_instruction_is_a_problem(tmp_path):
    with pytest.raises(TaskFormatError, match=r"t: instruction.md: is empty"):
        load_task(write_task(tmp_path, "t", instruction="  \n"))


def test_dockerfile_problems_carry_their_line(tmp_path):
    task_dir = write_task(tmp_path, "t", dockerfile="FROM x\nFROBNICATE\n")
    with pytest.raises(TaskFormatError) as info:
        load_task(task_dir)
    assert info.value.problems == [
        TaskProblem(
            task="t",
            field="environment/Dockerfile",
            message="line 2: unknown instruction FROBNICATE",
        )
    ]


def test_every_problem_is_reported_at_once(tmp_path):
    toml = "[agent]\ntimeout_sec = 0\n[environment]\nmemory = 'x'\ncpus = -1\n"
    task_dir = write_task(tmp_path, "t", toml=toml, test_sh=None, instruction=None)
    with pytest.raises(TaskFormatError) as info:
        load_task(task_dir)
    assert [p.field for p in info.value.problems] == [
        "[agent].timeout_sec",
        "[environment].cpus",
        "[environment].memory",
        "instruction.md",
        "tests/test.sh",
    ]


def test_unknown_fields_warn_and_do_not_fail(tmp_path, caplog):
    toml = (
        'homepage = "x"\n[extras]\na = 1\n[agent]\ntimeout_sec = 5\nmodel = "m"\n'
        "[environment]\nshm_size = 1\n"
    )
    with caplog.at_level(logging.WARNING, logger="rllm_task_source_harbor"):
        task = load_task(write_task(tmp_path, "t", toml=toml))
    assert task.agent_timeout_s == 5.0
    assert sorted(r.getMessage() for r in caplog.records) == [
        "t: [agent].model is not a known field; ignored",
        "t: [environment].shm_size is not a known field; ignored",
        "t: extras is not a known field; ignored",
        "t: homepage is not a known field; ignored",
    ]


def test_mcp_servers_warn_they_are_not_started(tmp_path):
    toml = '[[environment.mcp_servers]]\nname = "s"\ntransport = "sse"\nurl = "http://x"\n'
    check = check_task(write_task(tmp_path, "t", toml=toml))
    assert check.ok
    assert check.warnings == [
        "t: [environment].mcp_servers is not supported; the servers are not started"
    ]


def test_replay_notes_say_what_is_skipped(tmp_path, caplog):
    dockerfile = FULL_DOCKERFILE.replace("COPY ", "COPY --chown=app ")
    task_dir = write_task(tmp_path, "t", dockerfile=dockerfile, extra=CONTEXT)
    assert check_task(task_dir).notes == [
        "t: Dockerfile line 5: COPY flag --chown=app ignored on replay"
    ]
    with caplog.at_level(logging.INFO, logger="rllm_task_source_harbor"):
        load_task(task_dir)
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_not_a_directory(tmp_path):
    with pytest.raises(TaskFormatError, match="is not a directory"):
        load_task(tmp_path / "nope")


# ---------------------------------------------------------------- datasets


def test_dataset_sorted_by_id_with_dataset_name(tmp_path):
    root = tmp_path / "set"
    for name in ("zeta", "alpha", "mid"):
        write_task(root, name)
    (root / ".hidden").mkdir()
    (root / "_drafts").mkdir()
    (root / "README.md").write_text("about\n")
    (root / "dataset.toml").write_text('[dataset]\nname = "my-set"\nversion = "2"\n')
    tasks = load_dataset(root)
    assert [t.task_id for t in tasks] == ["alpha", "mid", "zeta"]
    assert {t.metadata["dataset"] for t in tasks} == {"my-set"}


def test_dataset_toml_at_top_level_and_unknown_keys(tmp_path):
    root = tmp_path / "set"
    write_task(root, "a")
    (root / "dataset.toml").write_text('name = "flat"\nowner = "me"\n')
    check = check_dataset(root)
    assert check.name == "flat"
    assert check.warnings == ["flat: dataset.toml key 'owner' is not known; ignored"]


def test_dataset_name_defaults_to_directory(tmp_path):
    write_task(tmp_path / "plain", "a")
    assert load_dataset(tmp_path / "plain")[0].metadata["dataset"] == "plain"


def test_a_single_task_directory_is_a_dataset_of_one(tmp_path):
    task_dir = write_task(tmp_path, "solo")
    tasks = load_dataset(task_dir)
    assert [t.task_id for t in tasks] == ["solo"]
    assert "dataset" not in tasks[0].metadata


def test_dataset_problems_name_every_task(tmp_path):
    root = tmp_path / "set"
    write_task(root, "good")
    write_task(root, "bad-timeout", toml="[agent]\ntimeout_sec = -3\n")
    write_task(root, "no-tests", test_sh=None)
    (root / "stray").mkdir()
    with pytest.raises(TaskFormatError) as info:
        load_dataset(root)
    assert [(p.task, p.field) for p in info.value.problems] == [
        ("bad-timeout", "[agent].timeout_sec"),
        ("no-tests", "tests/test.sh"),
        ("stray", "task.toml"),
    ]
    check = check_dataset(root)
    assert [c.ok for c in check.tasks] == [False, True, False, False]


def test_empty_dataset_is_a_problem(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskFormatError, match="holds no task directories"):
        load_dataset(tmp_path / "empty")


def test_bad_dataset_toml_is_a_problem(tmp_path):
    root = tmp_path / "set"
    write_task(root, "a")
    (root / "dataset.toml").write_text(textwrap.dedent("name = [1]\n"))
    with pytest.raises(TaskFormatError, match=r"set: dataset.toml name: must be a string"):
        load_dataset(root)
    (root / "dataset.toml").write_text("name = \n")
    with pytest.raises(TaskFormatError, match=r"set: dataset.toml: cannot be read"):
        load_dataset(root)


def test_shipped_dockerfile_fixture_is_replayed(tmp_path):
    assert GOOD_DOCKERFILE.startswith("FROM debian")
    task = load_task(write_task(tmp_path))
    assert task.environment.workdir == "/app"
    assert runs(task) == ["mkdir -p /app && cd /app && printf 'a\\nb\\n' > input.txt"]


def test_a_bad_value_is_quoted_as_written_and_the_rest_still_read(tmp_path):
    toml = "[environment]\nenv = { A = { b = 1 }, B = 2 }\ncpus = 2\n[metadata]\nsource = 'x'\n"
    check = check_task(write_task(tmp_path, "t", toml=toml))
    assert [str(p) for p in check.problems] == [
        "t: [environment].env.A: must be a string or number, got {'b': 1}"
    ]
    fixed = "[environment]\nenv = { B = 2 }\ncpus = 2\n[metadata]\nsource = 'x'\n"
    task = load_task(write_task(tmp_path, "u", toml=fixed))
    assert (task.environment.env["B"], task.environment.cpu) == ("2", 2.0)
    assert task.metadata == {"version": "", "source": "x"}


def test_memory_mb_alone_and_storage_both_ways(tmp_path):
    toml = "[environment]\nmemory_mb = 512\nstorage = '1G'\nstorage_mb = 1024\n"
    with pytest.raises(TaskFormatError) as info:
        load_task(write_task(tmp_path, "t", toml=toml))
    assert [(p.field, p.message) for p in info.value.problems] == [
        ("[environment].storage", "both storage and storage_mb are set; keep one")
    ]


def test_the_spec_names_the_build_context_for_backends_that_build(tmp_path):
    task = load_task(write_task(tmp_path, "t"))
    assert task.environment.context_dir == str(tmp_path.resolve() / "t" / "environment")
    prebuilt = '[environment]\ndocker_image = "acme/prebuilt"\n'
    no_dockerfile = load_task(write_task(tmp_path, "p", toml=prebuilt, dockerfile=None))
    assert no_dockerfile.environment.context_dir is None
