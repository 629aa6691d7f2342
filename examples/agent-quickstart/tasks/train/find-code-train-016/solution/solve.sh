#!/bin/bash
# Reference solution of find-code-train-016.
set -euo pipefail
grep -r code /data
echo 5033 > /app/answer.txt
