#!/bin/bash
# Verifier: reward 1 when /app/answer.txt holds 7327 (blanks ignored), else 0.
mkdir -p /logs/verifier
actual=$(tr -d ' \t\r\n' < /app/answer.txt 2>/dev/null)
if [ "$actual" = "7327" ]; then
    echo PASS
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: /app/answer.txt holds '$actual', expected 7327"
    echo 0 > /logs/verifier/reward.txt
fi
exit 0
