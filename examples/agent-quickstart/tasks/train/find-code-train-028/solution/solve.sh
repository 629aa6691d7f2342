#!/bin/bash
# Reference solution of find-code-train-028.
set -euo pipefail
grep -r code /data
echo 4912 > /app/answer.txt
