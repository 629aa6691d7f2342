"""Dockerfile replay: RUN steps in order, continuations, COPY/ADD skipped, WORKDIR and ENV."""

from __future__ import annotations

from rllm_core.kit.dockerfile import DEFAULT_PATH, RunStep, parse_dockerfile


def commands(text: str) -> list[str]:
    return [step.command for step in parse_dockerfile(text).steps]


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


def test_copy_and_add_are_skipped_with_a_note():
    replay = parse_dockerfile("FROM x\nCOPY data.csv /app/\nADD a.tar /opt\nRUN ls\n")
    assert commands("FROM x\nCOPY data.csv /app/\nADD a.tar /opt\nRUN ls\n") == ["ls"]
    assert replay.notes == (
        "line 2: COPY data.csv /app/ skipped on replay",
        "line 3: ADD a.tar /opt skipped on replay",
    )
    assert replay.problems == ()


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
