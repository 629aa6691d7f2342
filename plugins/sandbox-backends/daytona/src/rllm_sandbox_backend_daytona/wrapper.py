"""The shell protocol the backend speaks inside a Daytona sandbox.

Daytona runs a command string through the sandbox's shell and returns its merged output as
text. To get exit codes, output caps, user switching, env and a killable process tree right on
every image, each command is wrapped in a POSIX ``sh`` script (sent base64-encoded, so no
quoting reaches the remote shell) that:

- makes a per-call directory ``/tmp/.rllm-daytona/<call id>`` holding ``cmd.sh`` (the command
  as given) and ``run.sh`` (exports, then ``sh cmd.sh`` in the background and ``wait``, so the shell
  prints no job notice when a signal kills the command);
- changes to ``cwd``, switches to ``user`` (``runuser``/``su`` when the sandbox's own user is
  root, ``sudo -n`` otherwise) and starts ``run.sh`` under ``setsid``, so the command and
  everything it starts share one new process group whose id ``run.sh`` writes to ``pgid``;
- pipes the merged output through ``head -c <limit + 1>`` and drains the rest, so a command
  never blocks on a full pipe and a huge output never leaves the sandbox;
- prints one report line ``<marker> <exit code> <truncated 0|1> <output in base64> <marker>``
  and removes the call directory.

A timeout is enforced by the caller, which then runs :func:`kill_script` to kill the process
group. The image needs ``sh``, ``base64``, ``head``, ``setsid`` and, to switch users,
``runuser``/``su`` or ``sudo``: coreutils and util-linux (or busybox) provide them.
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "WRAP_ROOT",
    "Report",
    "WrappedCommand",
    "kill_script",
    "launcher",
    "parse_report",
    "validate_env",
    "validate_user",
    "wrap",
]

WRAP_ROOT = "/tmp/.rllm-daytona"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?\Z")
_CALL_ID = re.compile(r"[a-z0-9]+\Z")


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


@dataclass(frozen=True, slots=True)
class WrappedCommand:
    """A wrapped command: ``script`` runs it, ``marker`` delimits its report."""

    call_id: str
    script: str
    marker: str

    @property
    def call_dir(self) -> str:
        return f"{WRAP_ROOT}/{self.call_id}"


@dataclass(frozen=True, slots=True)
class Report:
    """What the wrapper printed: the command's exit code and its kept output bytes."""

    exit_code: int
    output: bytes
    truncated: bool


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
) -> WrappedCommand:
    """Build the script that runs ``command`` as described in the module docstring.

    ``env`` is exported before the command runs (after any user switch, so it survives
    ``su``). Raises ValueError for a NUL in the command, an invalid env name or user.
    """
    if "\0" in command:
        raise ValueError("the command contains a NUL byte, which no shell can run; remove it")
    if not _CALL_ID.match(call_id):
        raise ValueError(f"call id {call_id!r} must be lowercase letters and digits")
    validate_env(env)
    if user is not None:
        validate_user(user)
    directory = f"{WRAP_ROOT}/{call_id}"
    marker = f"@@rllm-{call_id}@@"
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    run = (
        f"echo $$ > {directory}/pgid\n"
        f"[ -e {directory}/killed ] && exit 137\n"
        f"{exports}"
        f"sh {directory}/cmd.sh & wait $! 2>/dev/null\n"
        f"echo $? > {directory}/rc\n"
    )
    limit = int(output_limit_bytes)
    script = f"""D={directory}
U={shlex.quote(user or "")}
mkdir -p {WRAP_ROOT} 2>/dev/null
chmod 1777 {WRAP_ROOT} 2>/dev/null
if ! mkdir -m 777 "$D"; then
  echo "cannot create the call directory $D"
  exit 125
fi
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
if cd -- {shlex.quote(cwd)} 2>"$D/out"; then
  {{ start </dev/null 2>&1; echo $? > "$D/rc0"; }} |
    {{ head -c {limit + 1} > "$D/out"; cat >/dev/null; }}
else
  echo 1 > "$D/rc0"
fi
rc=$(cat "$D/rc" 2>/dev/null || cat "$D/rc0" 2>/dev/null)
[ -n "$rc" ] || rc=125
t=0
[ "$(wc -c < "$D/out")" -gt {limit} ] && t=1
printf '\\n{marker} %s %s ' "$rc" "$t"
head -c {limit} "$D/out" | base64
printf ' {marker}\\n'
rm -rf "$D"
exit "$rc"
"""
    return WrappedCommand(call_id=call_id, script=script, marker=marker)


def launcher(script: str) -> str:
    """The command string that makes the sandbox's shell (sh, bash or zsh) run ``script``."""
    return f'sh -c "$(echo {_b64(script)} | base64 -d)"'


def kill_script(call_id: str) -> str:
    """A script that kills the process group of call ``call_id`` (waiting up to 5 s for it
    to start) and keeps a late start from running the command at all."""
    if not _CALL_ID.match(call_id):
        raise ValueError(f"call id {call_id!r} must be lowercase letters and digits")
    directory = f"{WRAP_ROOT}/{call_id}"
    return f"""D={directory}
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
    """Read the report line out of the shell's output; ``None`` when there is none."""
    pattern = re.escape(marker) + r" (-?\d+) ([01]) ([A-Za-z0-9+/=\s]*) " + re.escape(marker)
    found = re.search(pattern, text)
    if found is None:
        return None
    try:
        output = base64.b64decode("".join(found.group(3).split()), validate=True)
    except binascii.Error:
        return None
    return Report(exit_code=int(found.group(1)), output=output, truncated=found.group(2) == "1")
