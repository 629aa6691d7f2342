#!/bin/bash
# Reference solution of find-code-train-021.
set -euo pipefail
grep -r code /data
echo 8688 > /app/answer.txt
