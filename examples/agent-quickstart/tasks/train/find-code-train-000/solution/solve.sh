#!/bin/bash
# Reference solution of find-code-train-000.
set -euo pipefail
grep -r code /data
echo 2408 > /app/answer.txt
