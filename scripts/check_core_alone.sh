#!/usr/bin/env bash
# Prove the core installs and runs with no plugin: build a throwaway virtual environment in a
# temporary directory, install core/ into it the way a user would (a regular, non-editable
# install that resolves its dependencies from the package index), then check that the CLI
# imports and that `rllm-core plugins --json` reports no plugin at all.
#
# Skipped when RLLM_SKIP_CORE_ALONE=1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "${RLLM_SKIP_CORE_ALONE:-}" == "1" ]]; then
    echo "core-alone check skipped (RLLM_SKIP_CORE_ALONE=1)"
    exit 0
fi

# The base interpreter behind .venv, so the check uses the same Python version as the tests.
python="$("$ROOT/.venv/bin/python" -c 'import sys; print(sys._base_executable)')"

work="$(mktemp -d "${TMPDIR:-/tmp}/rllm-core-alone.XXXXXX")"
trap 'rm -rf "$work"' EXIT

"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "$ROOT/core"

# The install must not have left a path back into the source tree: the check would then test
# the checkout rather than the installed package.
"$work/venv/bin/python" - "$ROOT" <<'PY'
import pathlib
import sys

import rllm_core
import rllm_core.cli

installed = pathlib.Path(rllm_core.__file__).resolve()
source = pathlib.Path(sys.argv[1]).resolve()
if source in installed.parents:
    sys.exit(f"rllm_core was imported from the source tree ({installed}), not the installed copy")
PY

listing="$(cd "$work" && "$work/venv/bin/rllm-core" plugins --json)"
if ! "$work/venv/bin/python" -c 'import json, sys; sys.exit(json.loads(sys.argv[1]) != [])' "$listing"; then
    echo "rllm-core plugins --json with only the core installed printed:" >&2
    echo "$listing" >&2
    echo "expected []: the core must list no plugin when none is installed" >&2
    exit 1
fi
echo "core alone: 'import rllm_core.cli' works and 'rllm-core plugins --json' prints []"
