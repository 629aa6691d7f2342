#!/bin/bash
# Reference solution of find-code-train-024.
set -euo pipefail
grep -r code /data
echo 8060 > /app/answer.txt
