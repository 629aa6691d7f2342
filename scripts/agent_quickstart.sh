#!/usr/bin/env bash
# The agent quickstart (examples/agent-quickstart): a short SFT warm start, held-out pass@1 of
# its model, RL on the train tasks, held-out pass@1 again. Needs bubblewrap; extra arguments
# go to the RL run (for example --set run.seed=1).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CLI="$ROOT/.venv/bin/rllm-core"
PY="$ROOT/.venv/bin/python"
HERE="examples/agent-quickstart"
ATTEMPTS="${ATTEMPTS:-4}"

[[ -x "$CLI" ]] || { echo "agent-quickstart: error: $CLI is missing; run make setup" >&2; exit 2; }
command -v bwrap >/dev/null || {
    echo "agent-quickstart: error: bubblewrap is missing; install it (apt-get install bubblewrap)" >&2
    exit 2
}

pass_at_1() {
    "$PY" -c 'import json, sys; print(f"{json.load(sys.stdin)[\"pass@1\"]:.3f}")'
}

printf '==> rllm-core sft %s/sft.toml\n' "$HERE"
"$CLI" sft "$HERE/sft.toml"

printf '\n==> held-out pass@1 of the SFT model (%s attempts per task)\n' "$ATTEMPTS"
before=$("$CLI" eval "$HERE/rl.toml" --attempts "$ATTEMPTS" --json | pass_at_1)
echo "pass@1 $before"

printf '\n==> rllm-core run %s/rl.toml\n' "$HERE"
run_json=$("$CLI" run "$HERE/rl.toml" --json "$@")
checkpoint=$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["run_folder"])' "$run_json")

printf '\n==> held-out pass@1 after RL (%s)\n' "$checkpoint"
after=$("$CLI" eval "$HERE/rl.toml" --attempts "$ATTEMPTS" --checkpoint "$checkpoint" --json "$@" | pass_at_1)
printf '\nheld-out pass@1: %s before RL, %s after\n' "$before" "$after"
