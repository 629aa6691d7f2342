"""Dockerfile replay: RUN steps in order, continuations, COPY/ADD and the files they copy,
WORKDIR and ENV."""

from __future__ import annotations

from pathlib import Path

import pytest
from rllm_task_source_harbor.dockerfile import (
    DEFAULT_PATH,
    CopyPlan,
    CopyStep,
    RunStep,
    parse_dockerfile,
)


def commands(text: str) -> list[str]:
    return [step.command for step in parse_dockerfile(text).steps if isinstance(step, RunStep)]


def test_run_steps_in_order_with_base_image():
    replay = parse_dockerfile("FROM debian:bookworm-slim\nRUN echo one\nRUN echo two\n")
    assert replay.base_image == "debian:bookworm-slim"
    assert replay.steps == (
        RunStep(command="echo one", workdir=None, line=2),
        RunStep(command="echo two", workdir=None, line=3),
    )
    assert replay.problems == ()
    assert replay.setup_commands == ["echo one", "echo two"]


def test_continuation_joins_lines_with_one_space():
    text = "FROM x\nRUN apt-get update && \\\n    apt-get install -y jq \\\n\t&& echo ok\n"
    assert commands(text) == ["apt-get update && apt-get install -y jq && echo ok"]


def test_continuation_with_nothing_before_the_backslash():
    assert commands("FROM x\nRUN \\\n  echo a\n") == ["echo a"]


def test_comments_and_blank_lines_are_skipped_even_inside_a_continuation():
    text = "# top comment\n\nFROM x\n\n  # indented comment\nRUN echo a \\\n# inside\n  && echo b\n"
    replay = parse_dockerfile(text)
    assert [s.command for s in replay.steps] == ["echo a && echo b"]
    assert replay.steps[0].line == 6


def test_exec_form_is_shell_quoted():
    text = 'FROM x\nRUN ["printf", "%s\\n", "two words"]\n'
    assert commands(text) == ["printf '%s\n' 'two words'"]


def test_bad_exec_form_is_a_problem():
    replay = parse_dockerfile('FROM x\nRUN ["printf", 3]\n')
    assert replay.steps == ()
    assert replay.problems == ("line 2: RUN exec form must be a non-empty list of strings",)


def test_copy_and_add_are_steps_in_order_with_their_destination():
    text = (
        "FROM x\nARG DATA=data.csv\nCOPY $DATA /app/\nWORKDIR /srv\nRUN ls\n"
        'ADD conf.ini etc/app.ini\nCOPY ["a b.txt", "c.txt", "./"]\nCOPY seed .\n'
    )
    replay = parse_dockerfile(text)
    assert replay.problems == ()
    assert replay.steps == (
        CopyStep(keyword="COPY", sources=("data.csv",), dest="/app", into_directory=True, line=3),
        RunStep(command="ls", workdir="/srv", line=5),
        CopyStep(
            keyword="ADD",
            sources=("conf.ini",),
            dest="/srv/etc/app.ini",
            into_directory=False,
            line=6,
        ),
        CopyStep(
            keyword="COPY", sources=("a b.txt", "c.txt"), dest="/srv", into_directory=True, line=7
        ),
        CopyStep(keyword="COPY", sources=("seed",), dest="/srv", into_directory=True, line=8),
    )
    assert replay.setup_commands == ["mkdir -p /srv && cd /srv && ls"]
    step = replay.copy_steps[1]
    assert CopyStep.from_dict(step.to_dict()) == step


def test_copy_flags_are_noted_or_refused():
    replay = parse_dockerfile("FROM x\nCOPY --chown=app:app --chmod=644 a /a\n")
    assert replay.notes == (
        "line 2: COPY flag --chown=app:app ignored on replay",
        "line 2: COPY flag --chmod=644 ignored on replay",
    )
    assert len(replay.copy_steps) == 1


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("COPY --from=build /out /app/", "COPY --from=build copies from another build stage"),
        ("COPY --exclude=*.md . /app/", "COPY --exclude=*.md filters the copied files"),
        ("ADD https://example.com/a.txt /a", "'https://example.com/a.txt' downloads a remote"),
        ("ADD git@github.com:o/r.git /r", "downloads a remote file"),
        ("ADD data.tar.gz /opt/", "'data.tar.gz' is a tar archive, which Docker unpacks"),
        ("COPY a b /dest", "has 2 sources, so its destination '/dest' must end in '/'"),
        ("COPY onlyone", "needs at least one source and a destination"),
        ("COPY <<EOF /f\nhello\nEOF", "with a heredoc source is not replayed"),
    ],
)
def test_copies_replay_cannot_do_are_problems(line, problem):
    replay = parse_dockerfile(f"FROM x\n{line}\nRUN echo after\n")
    (found,) = replay.problems
    assert found.startswith("line 2: ") and problem in found, found
    assert [step.line for step in replay.steps] == [len(line.splitlines()) + 2]


def context(tmp_path: Path) -> Path:
    root = tmp_path / "environment"
    (root / "app" / "sub").mkdir(parents=True)
    (root / "app" / "empty").mkdir()
    (root / "app" / "main.py").write_text("print(1)\n")
    (root / "app" / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (root / "app" / "sub" / "run.sh").chmod(0o755)
    (root / "a.txt").write_text("a")
    (root / "b.txt").write_text("b")
    (root / ".hidden.txt").write_text("h")
    return root


def plan_of(line: str, root: Path, workdir: str = "/work") -> CopyPlan:
    (step,) = parse_dockerfile(f"FROM x\nWORKDIR {workdir}\n{line}\n").copy_steps
    return step.plan(root)


def test_a_directory_source_copies_its_contents_with_modes_and_empty_folders(tmp_path):
    root = context(tmp_path)
    plan = plan_of("COPY app /srv/app", root)
    assert [(host.relative_to(root).as_posix(), dest) for host, dest in plan.files] == [
        ("app/main.py", "/srv/app/main.py"),
        ("app/sub/run.sh", "/srv/app/sub/run.sh"),
    ]
    assert plan.executables == ("/srv/app/sub/run.sh",)
    assert plan.directories == ("/srv/app", "/srv/app/empty", "/srv/app/sub")
    assert not plan.may_be_directory


def test_file_destinations_relative_globs_and_the_ambiguous_single_file(tmp_path):
    root = context(tmp_path)
    single = plan_of("COPY a.txt data", root)
    assert [dest for _, dest in single.files] == ["/work/data"]
    assert single.may_be_directory and single.directories == ()
    into = plan_of("COPY /a.txt ./", root)
    assert [dest for _, dest in into.files] == ["/work/a.txt"]
    assert not into.may_be_directory and into.directories == ("/work",)
    globbed = plan_of("COPY *.txt in/", root)
    assert [dest for _, dest in globbed.files] == [
        "/work/in/.hidden.txt",
        "/work/in/a.txt",
        "/work/in/b.txt",
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("COPY missing.txt /m", "source 'missing.txt' is not in the build context"),
        ("COPY ../secret /s", "source '../secret' is outside the build context"),
        ("COPY *.csv /c/", "source '*.csv' matches no file in the build context"),
        ("COPY *.txt /one", "3 sources go to '/one', which must then end in '/'"),
        ("COPY link /l", "source 'link' leads outside the build context"),
    ],
)
def test_plans_that_cannot_be_replayed_raise_naming_the_line_and_source(tmp_path, line, message):
    root = context(tmp_path)
    (tmp_path / "outside").write_text("x")
    (root / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(ValueError, match=r"^line 3: COPY: ") as info:
        plan_of(line, root)
    assert message in str(info.value)


def test_workdir_applies_to_later_steps_and_relative_workdir_nests():
    replay = parse_dockerfile("FROM x\nRUN echo root\nWORKDIR /app\nRUN echo a\nWORKDIR sub\n")
    assert replay.workdir == "/app/sub"
    assert replay.steps[0].workdir is None
    assert replay.steps[1].workdir == "/app"
    assert replay.setup_commands == ["echo root", "mkdir -p /app && cd /app && echo a"]


def test_multiline_step_enters_its_workdir_or_stops():
    step = RunStep(command="echo a\necho b", workdir="/my dir", line=3)
    assert step.render() == "mkdir -p '/my dir' && cd '/my dir' || exit 1\necho a\necho b"


def test_env_forms_and_expansion():
    text = (
        "FROM x\n"
        'ENV A=1 B="two words"\n'
        "ENV LEGACY a value with spaces\n"
        "ENV C=${A}-$B PATH=/opt/bin:$PATH\n"
        "ENV D=$UNSET\n"
        "WORKDIR /srv/$A\n"
    )
    replay = parse_dockerfile(text)
    assert replay.env == {
        "A": "1",
        "B": "two words",
        "LEGACY": "a value with spaces",
        "C": "1-two words",
        "PATH": f"/opt/bin:{DEFAULT_PATH}",
        "D": "",
    }
    assert replay.workdir == "/srv/1"


def test_arg_defaults_fill_from():
    replay = parse_dockerfile("ARG BASE=debian:12\nFROM ${BASE} AS final\nRUN true\n")
    assert replay.base_image == "debian:12"


def test_from_platform_flag_is_skipped():
    assert parse_dockerfile("FROM --platform=linux/amd64 alpine:3\n").base_image == "alpine:3"


def test_only_the_final_stage_is_replayed():
    text = "FROM golang AS build\nRUN go build\nWORKDIR /src\nFROM debian\nRUN echo final\n"
    replay = parse_dockerfile(text)
    assert replay.base_image == "debian"
    assert [s.command for s in replay.steps] == ["echo final"]
    assert replay.workdir is None
    assert replay.notes == ("line 4: a new build stage starts; replay keeps only the final stage",)


def test_run_flags_are_dropped_with_a_note():
    replay = parse_dockerfile("FROM x\nRUN --mount=type=cache,target=/c --network=none make\n")
    assert [s.command for s in replay.steps] == ["make"]
    assert replay.notes == (
        "line 2: RUN flag --mount=type=cache,target=/c ignored on replay",
        "line 2: RUN flag --network=none ignored on replay",
    )


def test_heredoc_body_is_the_script():
    replay = parse_dockerfile("FROM x\nRUN <<EOF\necho one\necho two\nEOF\nRUN echo after\n")
    assert [s.command for s in replay.steps] == ["echo one\necho two", "echo after"]


def test_heredoc_inside_a_command_is_kept():
    text = "FROM x\nRUN cat <<'END' > /f\nline $HOME\nEND\n"
    assert commands(text) == ["cat <<'END' > /f\nline $HOME\nEND"]


def test_unclosed_heredoc_is_a_problem():
    assert parse_dockerfile("FROM x\nRUN <<EOF\necho\n").problems == (
        "line 2: heredoc 'EOF' is never closed",
    )


def test_user_is_recorded_and_noted_not_applied():
    replay = parse_dockerfile("FROM x\nUSER agent\nRUN whoami\n")
    assert replay.user == "agent"
    assert replay.steps[0].command == "whoami"
    assert replay.notes == ("line 2: USER agent skipped on replay",)


def test_metadata_instructions_are_ignored_silently():
    text = 'FROM x\nLABEL a=b\nEXPOSE 80\nCMD ["bash"]\nENTRYPOINT ["sh"]\nVOLUME /data\n'
    replay = parse_dockerfile(text)
    assert replay.problems == () and replay.notes == () and replay.steps == ()


def test_lowercase_instructions_are_read():
    assert parse_dockerfile("from x\nrun echo hi\n").steps[0].command == "echo hi"


def test_problems_are_reported_with_their_line():
    replay = parse_dockerfile("RUN echo early\nFROM x\nFROBNICATE y\nRUN\nENV =bad\nWORKDIR\n")
    assert replay.problems == (
        "line 1: RUN before the first FROM",
        "line 3: unknown instruction FROBNICATE",
        "line 4: RUN has no command",
        "line 5: ENV item '=bad' is not NAME=value",
        "line 6: WORKDIR names no directory",
    )


def test_missing_from_is_a_problem():
    assert parse_dockerfile("# nothing\n").problems == (
        "no FROM line: the Dockerfile names no base image",
    )


def test_a_linked_source_keeps_its_name_and_a_link_out_of_a_copied_folder_is_refused(tmp_path):
    root = context(tmp_path)
    (root / "alias.txt").symlink_to(root / "a.txt")
    plan = plan_of("COPY alias.txt /in/", root)
    assert [(host.name, dest) for host, dest in plan.files] == [("a.txt", "/in/alias.txt")]
    (tmp_path / "secret").write_text("x")
    (root / "app" / "sub" / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(ValueError, match=r"^line 3: COPY: .*leak leads outside the build"):
        plan_of("COPY app /srv/", root)
