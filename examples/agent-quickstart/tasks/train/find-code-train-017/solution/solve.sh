#!/bin/bash
# Reference solution of find-code-train-017.
set -euo pipefail
grep -r code /data
echo 8378 > /app/answer.txt
