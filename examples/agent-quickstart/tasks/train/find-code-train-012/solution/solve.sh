#!/bin/bash
# Reference solution of find-code-train-012.
set -euo pipefail
grep -r code /data
echo 8509 > /app/answer.txt
