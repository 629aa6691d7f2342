#!/bin/bash
# Reference solution of find-code-train-009.
set -euo pipefail
grep -r code /data
echo 4591 > /app/answer.txt
