#!/bin/bash
# Reference solution of find-code-train-033.
set -euo pipefail
grep -r code /data
echo 2037 > /app/answer.txt
