#!/bin/bash
# Verifier: reward 1 when /app/answer.txt holds 2408 (blanks ignored), else 0.
actual=$(tr -d ' \t\r\n' < /app/answer.txt 2>/dev/null)
if [ "$actual" = "2408" ]; then echo PASS; reward=1
else echo "FAIL: /app/answer.txt holds '$actual', expected 2408"; reward=0; fi
mkdir -p /logs/verifier && echo $reward > /logs/verifier/reward.txt; exit 0
