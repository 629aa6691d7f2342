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
#
# pytest spreads the tests over one pytest-xdist worker per core, four at most
# (RLLM_TEST_WORKERS=N sets the count; 1 runs every test in one process). Tests marked `install`
# uninstall and reinstall a package in the environment every other test runs in, so they run
# after the others, alone. Arguments that choose markers (-m) or workers (-n) run one pytest
# as given.
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

# The kit's pytest plugin writes its line about tests skipped for missing system packages
# here, one file per pytest run.
SKIPS_DIR="$(mktemp -d)"
trap 'rm -rf "$SKIPS_DIR"' EXIT

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

# run_pytest SKIPS_NAME [--none-ok] ARGS...: one pytest run. Selecting no test fails it unless
# --none-ok (the install tests' run, which a -k of the caller's may leave empty).
run_pytest() {
    local skips="$SKIPS_DIR/$1" none_ok=0
    shift
    if [[ "${1:-}" == "--none-ok" ]]; then
        none_ok=1
        shift
    fi
    RLLM_SYSTEM_SKIPS_FILE="$skips" "$VENV_BIN/python" -m pytest "$@"
    local status=$?
    if [[ $status -eq 5 ]]; then
        [[ $none_ok -eq 1 ]] && return 0
        echo "pytest collected no tests: that is a failure, not a pass" >&2
    fi
    return $status
}

test_workers() {
    if [[ -n "${RLLM_TEST_WORKERS:-}" ]]; then
        echo "$RLLM_TEST_WORKERS"
        return
    fi
    "$VENV_BIN/python" -c 'import os; print(min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 4))'
}

# True when the caller's pytest arguments choose markers or workers themselves.
chooses_itself() {
    local arg
    for arg in "$@"; do
        case "$arg" in
        -m | -m* | -n | -n* | --numprocesses | --numprocesses=*) return 0 ;;
        esac
    done
    return 1
}

run_step "ruff check" "$VENV_BIN/ruff" check "$ROOT"
run_step "ruff format --check" "$VENV_BIN/ruff" format --check "$ROOT"
if [[ "${RLLM_SKIP_CORE_ALONE:-}" == "1" ]]; then
    names+=("core installs and runs alone")
    results+=("SKIP  (RLLM_SKIP_CORE_ALONE=1)")
else
    run_step "core installs and runs alone" bash "$ROOT/scripts/check_core_alone.sh"
fi
workers="$(test_workers)"
if chooses_itself "$@" || [[ "$workers" -le 1 ]]; then
    run_step "pytest" run_pytest all "$@"
else
    run_step "pytest ($workers workers)" run_pytest parallel -n "$workers" --dist load \
        -m "not install" "$@"
    run_step "pytest (install tests, alone)" run_pytest install --none-ok -m install "$@"
fi

printf '\n==> summary\n'
for i in "${!names[@]}"; do
    printf '  %-32s %s\n' "${names[$i]}" "${results[$i]}"
done
if [[ $failed -ne 0 ]]; then
    printf 'FAILED: fix the steps marked FAIL above.\n'
else
    printf 'all checks passed\n'
fi
cat "$SKIPS_DIR"/* 2>/dev/null
exit $failed
