"""The argument vectors the backend hands to Modal's ``exec``, which runs no shell itself.

A command runs as ``bash -lc SCRIPT``, where SCRIPT exports the environment, changes to the
working directory and then holds the command text unchanged. A small supervisor shell around
it starts that login shell as a job in its own process group (``set -m``), records the group
id in ``$TMPDIR/rllm-exec/<exec id>.pid`` while it runs and exits with its status (``128+n``
when killed by signal ``n``). Killing a timed-out command is a second exec that sends
SIGKILL to that process group, so the command and everything it started are gone, whatever
Modal's own exec deadline does. The supervisor keeps its own stderr quiet (bash would report
the killed job there), and the command's stdin is ``/dev/null``.

A user other than the sandbox's default runs the login shell through ``runuser -u`` (``su``
when runuser is missing), which needs the default user to be root, as it is on Modal.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from rllm_core.errors import SandboxError

__all__ = ["command_script", "exec_argv", "kill_argv"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?$")

_SUPERVISOR = """\
d="${TMPDIR:-/tmp}/rllm-exec"
mkdir -p "$d" || exit 125
exec 3>&2 2>/dev/null
set -m
if [ -z "$2" ]; then
  bash -lc "$3" 2>&3 3>&- </dev/null &
elif command -v runuser >/dev/null; then
  runuser -u "$2" -- bash -lc "$3" 2>&3 3>&- </dev/null &
else
  su -s /bin/bash "$2" -c "$3" 2>&3 3>&- </dev/null &
fi
p=$!
echo "$p" > "$d/$1.pid"
wait "$p"
c=$?
rm -f "$d/$1.pid"
exit "$c"
"""

# The pid file may not be written yet when a timeout comes very early, so wait a moment
# for it; a missing file after that means the command has already finished.
_KILLER = """\
f="${TMPDIR:-/tmp}/rllm-exec/$1.pid"
i=0
while [ ! -s "$f" ] && [ "$i" -lt 10 ]; do sleep 0.1; i=$((i + 1)); done
[ -s "$f" ] || exit 0
kill -KILL -- "-$(cat "$f")" 2>/dev/null
rm -f "$f"
exit 0
"""


def command_script(command: str, *, cwd: str, env: Mapping[str, str]) -> str:
    """The text ``bash -lc`` runs: ``export`` lines, ``cd``, then ``command`` verbatim.

    The exports come after the login profile has run, so a task's ``PATH`` survives a
    profile that resets it. Raises ``SandboxError`` for a NUL byte in the command or the
    environment, and for an environment name that is not a shell identifier.
    """
    if "\0" in command:
        raise SandboxError(
            f"command {command[:80]!r} contains a NUL byte, which no process argument can"
            " carry; remove it"
        )
    lines = []
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise SandboxError(
                f"environment variable name {name!r} is not a shell identifier; use letters,"
                " digits and '_', not starting with a digit"
            )
        if "\0" in value:
            raise SandboxError(f"environment variable {name} contains a NUL byte; remove it")
        lines.append(f"export {name}={shlex.quote(value)}")
    if "\0" in cwd:
        raise SandboxError(f"working directory {cwd!r} contains a NUL byte; remove it")
    lines.append(f"cd -- {shlex.quote(cwd)} || exit 1")
    lines.append(command)
    return "\n".join(lines)


def exec_argv(script: str, *, exec_id: str, user: str | None) -> list[str]:
    """The argument vector that runs ``script`` under the supervisor as ``user``."""
    if user is not None and not _USER_NAME.match(user):
        raise SandboxError(
            f"user {user!r} is not a valid user name; use letters, digits, '_', '.' and '-'"
        )
    return ["bash", "-c", _SUPERVISOR, "rllm-exec", exec_id, user or "", script]


def kill_argv(exec_id: str) -> list[str]:
    """The argument vector that kills the process group of the command ``exec_id``."""
    return ["bash", "-c", _KILLER, "rllm-kill", exec_id]
