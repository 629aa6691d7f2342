#!/bin/bash
# Reference solution of find-code-train-008.
set -euo pipefail
grep -r code /data
echo 7230 > /app/answer.txt
