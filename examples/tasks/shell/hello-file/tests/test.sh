#!/bin/bash
# Verifier of the task "hello-file". It never stops before writing a reward: 1 when every check
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
    expect_text /app/hello.txt "Hello, world!" || return 1
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
