#!/bin/bash
# Reference solution of find-code-train-025.
set -euo pipefail
grep -r code /data
echo 3832 > /app/answer.txt
