#!/bin/bash
# Reference solution of find-code-train-005.
set -euo pipefail
grep -r code /data
echo 2310 > /app/answer.txt
