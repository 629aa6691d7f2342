#!/bin/bash
# Reference solution of find-code-train-041.
set -euo pipefail
grep -r code /data
echo 6621 > /app/answer.txt
