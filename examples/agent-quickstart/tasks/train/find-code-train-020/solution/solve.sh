#!/bin/bash
# Reference solution of find-code-train-020.
set -euo pipefail
grep -r code /data
echo 3802 > /app/answer.txt
