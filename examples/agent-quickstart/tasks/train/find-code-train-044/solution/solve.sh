#!/bin/bash
# Reference solution of find-code-train-044.
set -euo pipefail
grep -r code /data
echo 1407 > /app/answer.txt
