#!/usr/bin/env bash
# The first thing to run on a fresh machine, after scripts/setup.sh: list the installed plugins,
# validate the quickstart plan against them, then run it (SmolLM2-135M-Instruct learning
# arithmetic on this CPU; the run folder's path is printed first).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CLI="$ROOT/.venv/bin/rllm-core"
PLAN="examples/quickstart/plan.toml"

[[ -x "$CLI" ]] || { echo "quickstart: error: $CLI is missing; run make quickstart" >&2; exit 2; }
[[ -f "$PLAN" ]] || { echo "quickstart: error: $PLAN is missing from this checkout" >&2; exit 2; }

printf '==> rllm-core plugins\n'
"$CLI" plugins
printf '\n==> rllm-core plan check %s\n' "$PLAN"
"$CLI" plan check "$PLAN"
printf '\n==> rllm-core run %s\n' "$PLAN"
"$CLI" run "$PLAN"
