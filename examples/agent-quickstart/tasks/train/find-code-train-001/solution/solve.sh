#!/bin/bash
# Reference solution of find-code-train-001.
set -euo pipefail
grep -r code /data
echo 7327 > /app/answer.txt
