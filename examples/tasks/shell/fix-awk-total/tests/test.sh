#!/bin/bash
# Verifier of the task "fix-awk-total". It never stops before writing a reward: 1 when every check
# passes, 0 otherwise; the reason for a 0 is printed.

expect_text() {
    # expect_text FILE TEXT: FILE exists and holds TEXT (trailing newlines ignored).
    if [ ! -f "$1" ]; then
        echo "missing file $1"
        return 1
    fi
    actual=$(cat "$1")
    if [ "$actual" != "$2" ]; then
        echo "$1 does not hold the expected text; it holds:"
        printf '%s\n' "$actual"
        return 1
    fi
}

expect_number() {
    # expect_number FILE N: FILE holds the number N (surrounding blanks ignored).
    if [ ! -f "$1" ]; then
        echo "missing file $1"
        return 1
    fi
    actual=$(tr -d ' \t\r\n' < "$1")
    if [ "$actual" != "$2" ]; then
        echo "$1 holds '$actual', expected $2"
        return 1
    fi
}

expect_mode() {
    # expect_mode FILE MODE: FILE has the octal permission bits MODE.
    if [ ! -f "$1" ]; then
        echo "missing file $1"
        return 1
    fi
    actual=$(stat -c '%a' "$1")
    if [ "$actual" != "$2" ]; then
        echo "$1 has mode $actual, expected $2"
        return 1
    fi
}

check() {
    out=$(awk -F, -f /app/total.awk /app/sales.csv 2>&1)
    [ "$out" = "68" ] || { echo "total.awk on sales.csv printed: $out"; return 1; }
    scratch=$(mktemp -d) || return 1
    printf 'item,qty,price\ncup,4,5\nmug,10,1\nbowl,1,7\n' > "$scratch/other.csv"
    out=$(awk -F, -f /app/total.awk "$scratch/other.csv" 2>&1)
    rm -rf "$scratch"
    [ "$out" = "37" ] || { echo "total.awk on another file printed: $out (expected 37)"; return 1; }
}

mkdir -p /logs/verifier
if check; then
    echo PASS
    echo 1 > /logs/verifier/reward.txt
else
    echo FAIL
    echo 0 > /logs/verifier/reward.txt
fi
exit 0
