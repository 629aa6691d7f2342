#!/bin/bash
# Reference solution of find-code-train-045.
set -euo pipefail
grep -r code /data
echo 5671 > /app/answer.txt
