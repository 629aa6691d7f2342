#!/bin/bash
# Reference solution of find-code-train-040.
set -euo pipefail
grep -r code /data
echo 4282 > /app/answer.txt
