#!/usr/bin/env bash
# Run every check on an environment prepared by scripts/setup.sh: ruff lint, ruff format, the
# core-alone install check, then pytest over core/tests, plugins, examples and tests (the
# testpaths in the root pyproject.toml). Every step runs even when an earlier one fails; a
# summary follows and the exit status is 1 when any step failed. When tests skipped for want of
# a system package (bubblewrap, chromium, tmux; scripts/setup.sh installs them as root), the last
# line names how many need which package.
#
# Arguments are passed to pytest (`scripts/test.sh -k plan -x`). When arguments are given the
# ruff and core-alone steps still run; set RLLM_SKIP_CORE_ALONE=1 to skip the latter.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV_BIN="$ROOT/.venv/bin"
if [[ ! -x "$VENV_BIN/python" ]]; then
    echo "test: error: $VENV_BIN/python is missing; run scripts/setup.sh (or make test) first" >&2
    exit 2
fi

names=()
results=()
failed=0

# The kit's pytest plugin writes its line about tests skipped for missing system packages here.
SYSTEM_SKIPS="$(mktemp)"
trap 'rm -f "$SYSTEM_SKIPS"' EXIT

# run_step NAME COMMAND...: run one step, time it and record PASS or FAIL.
run_step() {
    local name="$1"
    shift
    printf '\n==> %s\n' "$name"
    local start=$SECONDS status
    "$@"
    status=$?
    local took=$((SECONDS - start))
    names+=("$name")
    if [[ $status -eq 0 ]]; then
        results+=("PASS  ${took}s")
    else
        results+=("FAIL  ${took}s (exit $status)")
        failed=1
    fi
}

run_pytest() {
    RLLM_SYSTEM_SKIPS_FILE="$SYSTEM_SKIPS" "$VENV_BIN/python" -m pytest "$@"
    local status=$?
    if [[ $status -eq 5 ]]; then
        echo "pytest collected no tests: that is a failure, not a pass" >&2
    fi
    return $status
}

run_step "ruff check" "$VENV_BIN/ruff" check "$ROOT"
run_step "ruff format --check" "$VENV_BIN/ruff" format --check "$ROOT"
if [[ "${RLLM_SKIP_CORE_ALONE:-}" == "1" ]]; then
    names+=("core installs and runs alone")
    results+=("SKIP  (RLLM_SKIP_CORE_ALONE=1)")
else
    run_step "core installs and runs alone" bash "$ROOT/scripts/check_core_alone.sh"
fi
run_step "pytest" run_pytest "$@"

printf '\n==> summary\n'
for i in "${!names[@]}"; do
    printf '  %-32s %s\n' "${names[$i]}" "${results[$i]}"
done
if [[ $failed -ne 0 ]]; then
    printf 'FAILED: fix the steps marked FAIL above.\n'
else
    printf 'all checks passed\n'
fi
cat "$SYSTEM_SKIPS"
exit $failed
