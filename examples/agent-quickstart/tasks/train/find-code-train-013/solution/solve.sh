#!/bin/bash
# Reference solution of find-code-train-013.
set -euo pipefail
grep -r code /data
echo 7984 > /app/answer.txt
