#!/bin/bash
# Reference solution of find-code-held-out-029.
set -euo pipefail
grep -r code /data
echo 2523 > /app/answer.txt
