"""Reading a task's Dockerfile so that a backend booting its base image can replay it.

Replay runs the steps of the final build stage in order inside the sandbox, with the
``WORKDIR`` and ``ENV`` in effect: a ``RUN`` step as a shell command (:class:`RunStep`), a
``COPY`` or ``ADD`` step as files copied from the build context, the folder holding the
Dockerfile (:class:`CopyStep`, whose :meth:`~CopyStep.plan` lists them).

What copying replays as Docker does: several sources, ``*``/``?``/``[...]`` patterns (matched
in the context, dot files included), a directory source (its contents, not the directory
itself), a destination relative to the ``WORKDIR``, a destination ending in ``/`` (a
directory), executable bits. What it refuses, each a problem of the parse or of the plan:
``--from`` (another stage or image), ``--exclude`` and ``--parents``, heredoc sources
(``COPY <<EOF``), an ``ADD`` of a URL or a git repository, an ``ADD`` of a local tar archive
(Docker unpacks it), a source outside the context or not in it, and several sources to a
destination not ending in ``/``. ``--chown``, ``--chmod`` and ``--link`` are ignored with a
note (files belong to the sandbox's default user); ``.dockerignore`` is not read.
"""

from __future__ import annotations

import glob
import json
import os
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_PATH",
    "CopyPlan",
    "CopyStep",
    "DockerfileReplay",
    "RunStep",
    "parse_dockerfile",
]

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
_NOTED = frozenset({"USER", "SHELL"})
_COPY_FLAGS_IGNORED = frozenset({"--chown", "--chmod", "--link"})
_COPY_FLAGS_REFUSED = {
    "--from": "copies from another build stage or image, which replay cannot",
    "--exclude": "filters the copied files, which replay does not",
    "--parents": "keeps the source's parent directories, which replay does not",
}
_ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_REMOTE_RE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://|git@)")
_GLOB_RE = re.compile(r"[*?\[]")
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
class CopyPlan:
    """What one ``COPY``/``ADD`` step writes: ``files`` as ``(host path, sandbox path)``
    pairs, in order, ``executables`` (sandbox paths to mark executable) and ``directories``
    (sandbox directories to create, empty ones included). ``may_be_directory`` is true when
    the step copies one file to a destination without a trailing ``/``: if that destination
    is a directory in the sandbox, Docker puts the file inside it."""

    files: tuple[tuple[Path, str], ...]
    executables: tuple[str, ...] = ()
    directories: tuple[str, ...] = ()
    may_be_directory: bool = False


@dataclass(frozen=True, slots=True)
class CopyStep:
    """One ``COPY`` or ``ADD`` step: ``sources`` as written (variables expanded), relative to
    the build context; ``dest`` the absolute destination (a relative one joined to the
    ``WORKDIR`` in effect, else to ``/``); ``into_directory`` whether the destination is a
    directory (it ended in ``/``); the Dockerfile ``line``."""

    keyword: str
    sources: tuple[str, ...]
    dest: str
    into_directory: bool
    line: int

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-ready values (:meth:`from_dict` reads them back)."""
        return {
            "keyword": self.keyword,
            "sources": list(self.sources),
            "dest": self.dest,
            "into_directory": self.into_directory,
            "line": self.line,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CopyStep:
        return cls(
            keyword=str(data["keyword"]),
            sources=tuple(data["sources"]),
            dest=str(data["dest"]),
            into_directory=bool(data["into_directory"]),
            line=int(data["line"]),
        )

    def describe(self) -> str:
        return f"line {self.line}: {self.keyword} {' '.join(self.sources)} {self.dest}"

    def plan(self, context: str | Path) -> CopyPlan:
        """The files this step copies from the build context ``context``.

        Raises ``ValueError`` naming the line and the source when a source is outside the
        context, matches nothing, is missing, or when several files go to a destination
        that does not end in ``/``.
        """
        root = Path(context).resolve()
        where = f"line {self.line}: {self.keyword}"
        if not root.is_dir():
            raise ValueError(f"{where}: the build context {root} is not a directory")
        entries: list[tuple[str, Path]] = []
        for source in self.sources:
            relative = posixpath.normpath(source.lstrip("/") or ".")
            if relative == ".." or relative.startswith("../"):
                raise ValueError(f"{where}: source {source!r} is outside the build context {root}")
            if _GLOB_RE.search(relative):
                matches = sorted(glob.glob(relative, root_dir=root, include_hidden=True))
                if not matches:
                    raise ValueError(
                        f"{where}: source {source!r} matches no file in the build context {root}"
                    )
            else:
                matches = [relative]
            for match in matches:
                resolved = (root / match).resolve()
                _inside(root, resolved, f"{where}: source {source!r}")
                if not resolved.exists():
                    raise ValueError(
                        f"{where}: source {source!r} is not in the build context {root}; add"
                        f" it there or remove the step"
                    )
                # A linked source is copied under its own name, as Docker does.
                entries.append((posixpath.basename(match) or root.name, resolved))
        into_directory = self.into_directory or len(entries) > 1
        if len(entries) > 1 and not self.into_directory:
            raise ValueError(
                f"{where}: {len(entries)} sources go to {self.dest!r}, which must then end in"
                " '/' (a directory)"
            )
        files: list[tuple[Path, str]] = []
        directories: list[str] = [self.dest] if into_directory else []
        for name, entry in entries:
            if entry.is_dir():
                directories.append(self.dest)
                for folder, dirs, names in os.walk(entry):
                    dirs.sort()
                    here = Path(folder)
                    base = posixpath.normpath(
                        posixpath.join(self.dest, here.relative_to(entry).as_posix())
                    )
                    directories.append(base)
                    for file in sorted(names):
                        _inside(root, (here / file).resolve(), f"{where}: {here / file}")
                        files.append((here / file, posixpath.join(base, file)))
            else:
                target = posixpath.join(self.dest, name) if into_directory else self.dest
                files.append((entry, target))
        executables = [target for host, target in files if os.access(host, os.X_OK)]
        return CopyPlan(
            files=tuple(files),
            executables=tuple(executables),
            directories=tuple(dict.fromkeys(directories)),
            may_be_directory=not into_directory and len(files) == 1 and not entries[0][1].is_dir(),
        )


def _inside(root: Path, resolved: Path, what: str) -> None:
    """Refuse a path that resolves outside the build context (through a link, say)."""
    if resolved != root and root not in resolved.parents:
        raise ValueError(f"{what} leads outside the build context {root} (to {resolved})")


@dataclass(frozen=True, slots=True)
class DockerfileReplay:
    """What replaying a Dockerfile needs.

    ``base_image`` is the final stage's ``FROM`` image; ``steps`` its ``RUN``, ``COPY`` and
    ``ADD`` steps in order; ``workdir`` the last ``WORKDIR`` (``None`` when none); ``env``
    every ``ENV`` value, expanded; ``user`` the last ``USER`` (recorded, not applied).
    ``notes`` say what replay skips (``USER``, ``SHELL``, ``RUN`` flags, ignored ``COPY``
    flags, earlier stages); ``problems`` are lines that cannot be read or replayed, each
    starting with ``line N:``.
    """

    base_image: str | None
    steps: tuple[RunStep | CopyStep, ...] = ()
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def setup_commands(self) -> list[str]:
        """The ``RUN`` steps, each rendered as one shell command."""
        return [step.render() for step in self.steps if isinstance(step, RunStep)]

    @property
    def copy_steps(self) -> list[CopyStep]:
        return [step for step in self.steps if isinstance(step, CopyStep)]


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
        heredoc = _HEREDOC_RE.search(args) if keyword.upper() in ("RUN", "COPY", "ADD") else None
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
            # A COPY heredoc keeps only its first line: the step is refused, not replayed.
            if keyword.upper() == "RUN":
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


def _copy_step(
    keyword: str, args: str, line: int, workdir: str | None, variables: dict[str, str]
) -> tuple[CopyStep | None, list[str], str | None]:
    """The :class:`CopyStep` of a ``COPY``/``ADD`` line, with notes, or a problem."""
    notes = []
    where = f"line {line}: {keyword}"
    while args.startswith("--"):
        flag, _, args = args.partition(" ")
        args = args.lstrip()
        name = flag.partition("=")[0]
        if name in _COPY_FLAGS_IGNORED:
            notes.append(f"{where} flag {flag} ignored on replay")
            continue
        reason = _COPY_FLAGS_REFUSED.get(name, "is not understood by replay")
        return (
            None,
            notes,
            (
                f"{where} {flag} {reason}; create the files with RUN, or build the image and name"
                " it in [environment].docker_image with replay_dockerfile = false"
            ),
        )
    if "<<" in args:
        return (
            None,
            notes,
            (
                f"{where} with a heredoc source is not replayed; put the file in the build"
                " context (the Dockerfile's folder) and copy it from there"
            ),
        )
    if args.startswith("["):
        try:
            words = json.loads(args)
        except json.JSONDecodeError:
            words = None
        if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
            return None, notes, f"{where} exec form must be a list of strings"
    else:
        try:
            words = shlex.split(args, posix=True)
        except ValueError as exc:
            return None, notes, f"{where} {args!r} cannot be split: {exc}"
    words = [_expand(word, variables) for word in words]
    if len(words) < 2:
        return None, notes, f"{where} needs at least one source and a destination"
    *sources, dest = words
    for source in sources:
        if _REMOTE_RE.match(source):
            return (
                None,
                notes,
                (
                    f"{where} {source!r} downloads a remote file, which replay does not; fetch it"
                    " with RUN (curl, git clone) or put it in the build context"
                ),
            )
        if keyword == "ADD" and source.endswith(_ARCHIVE_SUFFIXES):
            return (
                None,
                notes,
                (
                    f"{where} {source!r} is a tar archive, which Docker unpacks and replay does"
                    " not; COPY it and unpack it with RUN tar -xf"
                ),
            )
    into_directory = dest.endswith("/") or posixpath.basename(dest) in (".", "")
    if not dest.startswith("/"):
        dest = posixpath.join(workdir or "/", dest)
    dest = posixpath.normpath(dest)
    if len(sources) > 1 and not into_directory:
        return (
            None,
            notes,
            (
                f"{where} has {len(sources)} sources, so its destination {words[-1]!r} must end in"
                " '/'"
            ),
        )
    step = CopyStep(
        keyword=keyword,
        sources=tuple(sources),
        dest=dest,
        into_directory=into_directory,
        line=line,
    )
    return step, notes, None


def parse_dockerfile(text: str) -> DockerfileReplay:
    """Read ``text`` into a :class:`DockerfileReplay`; never raises for a bad line (it becomes
    a problem)."""
    instructions, problems = _logical_lines(text)
    notes: list[str] = []
    args_seen: dict[str, str] = {}
    base_image: str | None = None
    steps: list[RunStep | CopyStep] = []
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
        elif keyword in ("COPY", "ADD"):
            copy, copy_notes, problem = _copy_step(
                keyword, args, line, workdir, {**args_seen, **env}
            )
            notes.extend(copy_notes)
            if problem:
                problems.append(problem)
            elif copy is not None:
                steps.append(copy)
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
