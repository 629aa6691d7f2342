"""The shell protocol a remote sandbox backend uses to run one command with a timeout.

A backend whose service runs a command string (or an argument vector) in a sandbox, but gives
no reliable exit code, output cap, user switch or way to kill what the command started, wraps
the command with :func:`wrap` and runs the result with ``sh``. The wrapper, a POSIX ``sh``
script that carries the command and its set-up base64-encoded (so no quoting reaches the
remote shell):

- makes a per-call directory ``<EXEC_ROOT>/<call id>`` holding ``cmd.sh`` (the command as
  given) and ``run.sh`` (exports, then ``sh cmd.sh`` in the background and ``wait``, so the
  shell prints no job notice when a signal kills the command); with ``login_bash`` the
  command runs as ``bash -l cmd.sh`` instead, so the login profile runs first and bash syntax
  works, and ``cmd.sh`` starts by exporting the env and entering ``cwd`` again, so a profile
  that resets ``PATH`` or changes directory does not undo them;
- changes to ``cwd``, switches to ``user`` (``runuser``/``su`` when the sandbox's own user is
  root, ``sudo -n`` otherwise) and starts ``run.sh`` under ``setsid``, so the command and
  everything it starts share one new process group whose id ``run.sh`` writes to ``pgid``;
- pipes stdout and stderr (or, with ``merge_output``, both together) through
  ``head -c <limit + 1>`` and drains the rest, so a command never blocks on a full pipe and a
  huge output never leaves the sandbox;
- prints one report line ``<marker> <exit code> <out truncated 0|1> <err truncated 0|1>
  <stdout in base64> . <stderr in base64> <marker>`` on its own stdout, removes the call
  directory and exits with the command's exit code (``128 + n`` when signal ``n`` killed it).

The caller enforces the timeout, then runs :func:`kill_script` (as a second command) to kill
the process group; a kill that comes before the command started keeps it from starting.
:func:`parse_report` reads the report back. A script longer than ``MAX_INLINE_SCRIPT`` does
not fit in one exec argument (Linux refuses one over 128 KiB): :func:`runnable` uploads it to
:func:`script_path` and runs :func:`run_script_file` instead. The image needs ``sh``,
``base64``, ``head``, ``setsid`` and, to switch users, ``runuser``/``su`` or ``sudo``:
coreutils and util-linux (or busybox) provide them.
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from rllm_core.errors import SandboxError
from rllm_core.types import ExecResult

__all__ = [
    "EXEC_ROOT",
    "MAX_INLINE_SCRIPT",
    "Report",
    "WrappedCommand",
    "kill_script",
    "launcher",
    "parse_report",
    "run_script_file",
    "runnable",
    "script_path",
    "validate_env",
    "validate_user",
    "wrap",
]

EXEC_ROOT = "/tmp/.rllm-exec"
MAX_INLINE_SCRIPT = 100_000

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?\Z")
_CALL_ID = re.compile(r"[a-z0-9]+\Z")
_B64 = r"([A-Za-z0-9+/=\s]*)"


def validate_env(env: Mapping[str, str]) -> None:
    """Raise ValueError naming the first variable that a shell cannot export."""
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise ValueError(
                f"environment variable name {name!r} is invalid: use letters, digits and '_',"
                " not starting with a digit"
            )
        if "\0" in value:
            raise ValueError(f"environment variable {name!r} contains a NUL byte; remove it")


def validate_user(user: str) -> None:
    """Raise ValueError when ``user`` is not a plain account name."""
    if not _USER_NAME.match(user):
        raise ValueError(
            f"user {user!r} is not a valid account name: use letters, digits, '_', '.' and '-'"
        )


def _check_call_id(call_id: str) -> None:
    if not _CALL_ID.match(call_id):
        raise ValueError(f"call id {call_id!r} must be lowercase letters and digits")


@dataclass(frozen=True, slots=True)
class WrappedCommand:
    """A wrapped command: ``sh -c script`` runs it, ``marker`` delimits its report."""

    call_id: str
    script: str
    marker: str


@dataclass(frozen=True, slots=True)
class Report:
    """What the wrapper printed: the exit code and the kept bytes of each stream."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    truncated: bool

    def exec_result(self, duration_s: float) -> ExecResult:
        """The sandbox contract's result: the streams decoded (invalid UTF-8 as U+FFFD)."""
        return ExecResult(
            exit_code=self.exit_code,
            stdout=self.stdout.decode("utf-8", errors="replace"),
            stderr=self.stderr.decode("utf-8", errors="replace"),
            truncated=self.truncated,
            duration_s=duration_s,
        )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def wrap(
    command: str,
    *,
    call_id: str,
    cwd: str,
    env: Mapping[str, str],
    user: str | None,
    output_limit_bytes: int,
    merge_output: bool = False,
    login_bash: bool = False,
    root: str = EXEC_ROOT,
) -> WrappedCommand:
    """Build the script that runs ``command`` as described in the module docstring.

    ``call_id`` (lowercase letters and digits) names the call for :func:`kill_script`;
    ``env`` is exported before the command runs (after any user switch, so it survives
    ``su``); ``merge_output`` sends stderr into stdout, in order; ``login_bash`` runs the
    command with ``bash -l`` (the image then needs bash). Raises SandboxError, naming the
    command, for a NUL in the command or ``cwd`` and for an invalid env name, user or call id.
    """
    try:
        if "\0" in command:
            raise ValueError("the command contains a NUL byte, which no shell can run; remove it")
        if "\0" in cwd:
            raise ValueError(f"working directory {cwd!r} contains a NUL byte; remove it")
        _check_call_id(call_id)
        validate_env(env)
        if user is not None:
            validate_user(user)
    except ValueError as exc:
        raise SandboxError(f"cannot run {command[:200]!r}: {exc}") from exc
    directory = f"{root}/{call_id}"
    marker = f"@@rllm-{call_id}@@"
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    shell = "bash -l" if login_bash else "sh"
    if login_bash:
        command = f"{exports}cd -- {shlex.quote(cwd)} || exit 1\n{command}"
    run = (
        f"echo $$ > {directory}/pgid\n"
        f"[ -e {directory}/killed ] && exit 137\n"
        f"{exports}"
        f"{shell} {directory}/cmd.sh & wait $! 2>/dev/null\n"
        f"echo $? > {directory}/rc\n"
    )
    limit = int(output_limit_bytes)
    # fd 3 carries stdout past the stderr pipe; merged output sends stderr the same way.
    streams = "1>&3 2>&1" if merge_output else "2>&1 1>&3"
    script = f"""D={directory}
U={shlex.quote(user or "")}
mkdir -p {root} 2>/dev/null
chmod 1777 {root} 2>/dev/null
if ! mkdir -m 777 "$D"; then
  echo "cannot create the call directory $D" >&2
  exit 125
fi
: > "$D/out"; : > "$D/err"
printf %s {_b64(command)} | base64 -d > "$D/cmd.sh"
printf %s {_b64(run)} | base64 -d > "$D/run.sh"
chmod 644 "$D/cmd.sh" "$D/run.sh"
S=
if setsid -w true 2>/dev/null; then S="setsid -w"
elif command -v setsid >/dev/null; then S=setsid
fi
start() {{
  if [ -z "$U" ] || [ "$(id -un)" = "$U" ]; then $S sh "$D/run.sh"
  elif [ "$(id -u)" = 0 ] && command -v runuser >/dev/null
  then runuser -u "$U" -- $S sh "$D/run.sh"
  elif [ "$(id -u)" = 0 ]; then su -s /bin/sh "$U" -c "$S sh $D/run.sh"
  else sudo -n -u "$U" -- $S sh "$D/run.sh"
  fi
}}
if cd -- {shlex.quote(cwd)} 2>"$D/{"out" if merge_output else "err"}"; then
  {{ {{ start </dev/null; echo $? > "$D/rc0"; }} {streams} 3>&- |
      {{ head -c {limit + 1} > "$D/err"; cat >/dev/null; }}; }} 3>&1 |
    {{ head -c {limit + 1} > "$D/out"; cat >/dev/null; }}
else
  echo 1 > "$D/rc0"
fi
rc=$(cat "$D/rc" 2>/dev/null || cat "$D/rc0" 2>/dev/null)
[ -n "$rc" ] || rc=125
to=0; te=0
[ "$(wc -c < "$D/out")" -gt {limit} ] && to=1
[ "$(wc -c < "$D/err")" -gt {limit} ] && te=1
printf '\\n{marker} %s %s %s ' "$rc" "$to" "$te"
head -c {limit} "$D/out" | base64
printf ' . '
head -c {limit} "$D/err" | base64
printf ' {marker}\\n'
rm -rf "$D"
exit "$rc"
"""
    return WrappedCommand(call_id=call_id, script=script, marker=marker)


def launcher(script: str) -> str:
    """A command string that makes any shell (sh, bash or zsh) run ``script``."""
    return f'sh -c "$(echo {_b64(script)} | base64 -d)"'


def script_path(call_id: str, *, root: str = EXEC_ROOT) -> str:
    """Where to upload the wrapped script of call ``call_id`` when it is too long to inline."""
    _check_call_id(call_id)
    return f"{root}/{call_id}.sh"


def run_script_file(path: str) -> str:
    """A shell command that runs the uploaded script at ``path``, removes it and exits with
    the script's exit code."""
    quoted = shlex.quote(path)
    return f"sh {quoted}; r=$?; rm -f {quoted}; exit $r"


async def runnable(
    script: str,
    call_id: str,
    upload: Callable[[str, bytes], Awaitable[None]],
    *,
    inline: Callable[[str], str] = str,
) -> str:
    """The command that runs ``script`` (the wrapped script of call ``call_id``):
    ``inline(script)`` when that fits in ``MAX_INLINE_SCRIPT`` characters, otherwise
    :func:`run_script_file` on the copy that ``upload(path, data)`` writes to
    :func:`script_path`."""
    command = inline(script)
    if len(command) <= MAX_INLINE_SCRIPT:
        return command
    path = script_path(call_id)
    await upload(path, script.encode("utf-8"))
    return run_script_file(path)


def kill_script(call_id: str, *, root: str = EXEC_ROOT) -> str:
    """A script that kills the process group of call ``call_id`` (waiting up to 5 s for it
    to start) and keeps a late start from running the command at all."""
    _check_call_id(call_id)
    return f"""D={root}/{call_id}
[ -d "$D" ] || exit 0
: > "$D/killed" 2>/dev/null
i=0
while [ ! -s "$D/pgid" ] && [ -d "$D" ] && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
p=$(cat "$D/pgid" 2>/dev/null)
[ -n "$p" ] || exit 0
kill -9 "-$p" 2>/dev/null || sudo -n kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null
exit 0
"""


def parse_report(text: str, marker: str) -> Report | None:
    """Read the report line out of the wrapper's output; ``None`` when there is none."""
    m = re.escape(marker)
    found = re.search(rf"{m} (-?\d+) ([01]) ([01]) {_B64} \. {_B64} {m}", text)
    if found is None:
        return None
    try:
        out, err = (
            base64.b64decode("".join(found.group(i).split()), validate=True) for i in (4, 5)
        )
    except binascii.Error:
        return None
    return Report(
        exit_code=int(found.group(1)),
        stdout=out,
        stderr=err,
        truncated=found.group(2) == "1" or found.group(3) == "1",
    )
