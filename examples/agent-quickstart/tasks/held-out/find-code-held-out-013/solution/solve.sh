#!/bin/bash
# Reference solution of find-code-held-out-013.
set -euo pipefail
grep -r code /data
echo 4277 > /app/answer.txt
