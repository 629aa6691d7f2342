#!/bin/bash
# Reference solution of find-code-train-004.
set -euo pipefail
grep -r code /data
echo 4863 > /app/answer.txt
