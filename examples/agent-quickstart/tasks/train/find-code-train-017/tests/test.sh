#!/bin/bash
# Verifier: reward 1 when /app/answer.txt holds 8378 (blanks ignored), else 0.
mkdir -p /logs/verifier
actual=$(tr -d ' \t\r\n' < /app/answer.txt 2>/dev/null)
if [ "$actual" = "8378" ]; then
    echo PASS
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: /app/answer.txt holds '$actual', expected 8378"
    echo 0 > /logs/verifier/reward.txt
fi
exit 0
