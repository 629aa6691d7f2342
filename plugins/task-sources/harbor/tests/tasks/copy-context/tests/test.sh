#!/bin/bash
# Verifier of the task "copy-context": 1 when /app/total.txt holds the sum of the prices the
# Dockerfile copied in, 0 otherwise.
mkdir -p /logs/verifier
if [ "$(tr -d ' \n' < /app/total.txt 2>/dev/null)" = 12 ]; then
    echo PASS
    echo 1 > /logs/verifier/reward.txt
else
    echo FAIL
    echo 0 > /logs/verifier/reward.txt
fi
exit 0
