#!/bin/bash
# Reference solution of find-code-train-032.
set -euo pipefail
grep -r code /data
echo 3698 > /app/answer.txt
