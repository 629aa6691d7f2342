#!/bin/bash
# Reference solution of find-code-train-029.
set -euo pipefail
grep -r code /data
echo 1883 > /app/answer.txt
