"""Reading a task's Dockerfile so that a backend booting its base image can replay it.

Replay runs the ``RUN`` steps of the final build stage in order, as shell commands inside the
sandbox, with the ``WORKDIR`` and ``ENV`` in effect. Files are not copied: ``COPY`` and
``ADD`` are skipped with a note, so a task meant for replay creates its inputs with ``RUN``.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

__all__ = ["DEFAULT_PATH", "DockerfileReplay", "RunStep", "parse_dockerfile"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""What ``$PATH`` expands to in ``ENV`` when nothing earlier set it (Docker's default)."""

_IGNORED = frozenset(
    {
        "CMD",
        "ENTRYPOINT",
        "EXPOSE",
        "LABEL",
        "MAINTAINER",
        "VOLUME",
        "HEALTHCHECK",
        "STOPSIGNAL",
        "ONBUILD",
    }
)
_NOTED = frozenset({"COPY", "ADD", "USER", "SHELL"})
_VAR_RE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)
_HEREDOC_RE = re.compile(r"<<-?\s*(?P<quote>[\"']?)(?P<word>[A-Za-z_][A-Za-z0-9_]*)(?P=quote)")


@dataclass(frozen=True, slots=True)
class RunStep:
    """One ``RUN`` step: the shell command, the ``WORKDIR`` in effect (``None`` before any)
    and the Dockerfile line it starts on."""

    command: str
    workdir: str | None
    line: int

    def render(self) -> str:
        """The step as one self-contained shell command (it enters its ``WORKDIR``)."""
        if self.workdir is None:
            return self.command
        quoted = shlex.quote(self.workdir)
        enter = f"mkdir -p {quoted} && cd {quoted}"
        if "\n" in self.command:
            return f"{enter} || exit 1\n{self.command}"
        return f"{enter} && {self.command}"


@dataclass(frozen=True, slots=True)
class DockerfileReplay:
    """What replaying a Dockerfile needs.

    ``base_image`` is the final stage's ``FROM`` image; ``steps`` its ``RUN`` steps; ``workdir``
    the last ``WORKDIR`` (``None`` when none); ``env`` every ``ENV`` value, expanded; ``user``
    the last ``USER`` (recorded, not applied). ``notes`` say what replay skips (``COPY``,
    ``ADD``, ``USER``, ``SHELL``, ``RUN`` flags, earlier stages); ``problems`` are lines that
    cannot be read, each starting with ``line N:``.
    """

    base_image: str | None
    steps: tuple[RunStep, ...] = ()
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def setup_commands(self) -> list[str]:
        return [step.render() for step in self.steps]


@dataclass(slots=True)
class _Instruction:
    line: int
    keyword: str
    args: str


def _logical_lines(text: str) -> tuple[list[_Instruction], list[str]]:
    """Split into instructions: comments and blank lines dropped, ``\\`` continuations joined
    with one space, heredoc bodies (``RUN <<EOF``) kept with their newlines."""
    raw = text.splitlines()
    instructions: list[_Instruction] = []
    problems: list[str] = []
    i = 0
    while i < len(raw):
        start = i
        stripped = raw[i].strip()
        i += 1
        if not stripped or stripped.startswith("#"):
            continue
        parts: list[str] = []
        current = stripped
        while current.endswith("\\"):
            parts.append(current[:-1].strip())
            current = ""
            while i < len(raw):
                candidate = raw[i].strip()
                i += 1
                if candidate.startswith("#"):
                    continue
                current = candidate
                break
            else:
                break
        if current:
            parts.append(current)
        logical = " ".join(part for part in parts if part)
        keyword, _, args = logical.partition(" ")
        args = args.strip()
        heredoc = _HEREDOC_RE.search(args) if keyword.upper() == "RUN" else None
        if heredoc is not None:
            terminator = heredoc["word"]
            body: list[str] = []
            while i < len(raw) and raw[i].strip() != terminator:
                body.append(raw[i])
                i += 1
            if i >= len(raw):
                problems.append(f"line {start + 1}: heredoc {terminator!r} is never closed")
            else:
                i += 1
            if heredoc.start() == 0 and not args[heredoc.end() :].strip():
                # ``RUN <<EOF`` alone: the body is the script.
                args = "\n".join(body)
            else:
                args = "\n".join([args, *body, terminator])
        instructions.append(_Instruction(line=start + 1, keyword=keyword.upper(), args=args))
    return instructions, problems


def _expand(value: str, variables: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match["braced"] or match["plain"]
        if name in variables:
            return variables[name]
        return DEFAULT_PATH if name == "PATH" else ""

    return _VAR_RE.sub(substitute, value)


def _parse_env(args: str, line: int) -> tuple[list[tuple[str, str]], str | None]:
    try:
        words = shlex.split(args, posix=True)
    except ValueError as exc:
        return [], f"line {line}: ENV {args!r} cannot be split: {exc}"
    if not words:
        return [], f"line {line}: ENV needs a name and a value"
    if "=" not in words[0]:
        # Legacy form ``ENV NAME value with spaces``.
        name, _, rest = args.partition(" ")
        return [(name, rest.strip())], None
    pairs = []
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or not name:
            return [], f"line {line}: ENV item {word!r} is not NAME=value"
        pairs.append((name, value))
    return pairs, None


def _run_command(args: str, line: int) -> tuple[str | None, list[str], str | None]:
    """The shell command of a ``RUN``: flags (``--mount=...``) dropped with a note, exec form
    (a JSON array) joined with shell quoting."""
    notes = []
    while args.startswith("--"):
        flag, _, args = args.partition(" ")
        args = args.lstrip()
        notes.append(f"line {line}: RUN flag {flag} ignored on replay")
    if args.startswith("["):
        try:
            argv = json.loads(args)
        except json.JSONDecodeError:
            argv = None
        if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
            return shlex.join(argv), notes, None
        if argv is not None:
            return None, notes, f"line {line}: RUN exec form must be a non-empty list of strings"
    if not args:
        return None, notes, f"line {line}: RUN has no command"
    return args, notes, None


def parse_dockerfile(text: str) -> DockerfileReplay:
    """Read ``text`` into a :class:`DockerfileReplay`; never raises for a bad line (it becomes
    a problem)."""
    instructions, problems = _logical_lines(text)
    notes: list[str] = []
    args_seen: dict[str, str] = {}
    base_image: str | None = None
    steps: list[RunStep] = []
    workdir: str | None = None
    env: dict[str, str] = {}
    user: str | None = None
    stages = 0
    for ins in instructions:
        keyword, args, line = ins.keyword, ins.args, ins.line
        if keyword == "FROM":
            if stages:
                notes.append(
                    f"line {line}: a new build stage starts; replay keeps only the final stage"
                )
            stages += 1
            words = [w for w in args.split() if not w.startswith("--")]
            if not words:
                problems.append(f"line {line}: FROM names no image")
                continue
            base_image = _expand(words[0], args_seen)
            steps, workdir, env, user = [], None, {}, None
        elif stages == 0 and keyword != "ARG":
            problems.append(f"line {line}: {keyword} before the first FROM")
        elif keyword == "ARG":
            name, sep, default = args.partition("=")
            if sep:
                args_seen.setdefault(name.strip(), default.strip().strip("\"'"))
        elif keyword == "RUN":
            command, run_notes, problem = _run_command(args, line)
            notes.extend(run_notes)
            if problem:
                problems.append(problem)
            elif command is not None:
                steps.append(RunStep(command=command, workdir=workdir, line=line))
        elif keyword == "WORKDIR":
            target = _expand(args.strip().strip("\"'"), {**args_seen, **env})
            if not target:
                problems.append(f"line {line}: WORKDIR names no directory")
                continue
            if not target.startswith("/"):
                target = f"{(workdir or '').rstrip('/')}/{target}"
            workdir = target
        elif keyword == "ENV":
            pairs, problem = _parse_env(args, line)
            if problem:
                problems.append(problem)
            for name, value in pairs:
                env[name] = _expand(value, {**args_seen, **env})
        elif keyword in _NOTED:
            if keyword == "USER":
                user = args.strip()
            notes.append(f"line {line}: {keyword} {args} skipped on replay")
        elif keyword not in _IGNORED:
            problems.append(f"line {line}: unknown instruction {keyword}")
    if stages == 0 and not problems:
        problems.append("no FROM line: the Dockerfile names no base image")
    return DockerfileReplay(
        base_image=base_image,
        steps=tuple(steps),
        workdir=workdir,
        env=env,
        user=user,
        notes=tuple(notes),
        problems=tuple(problems),
    )
