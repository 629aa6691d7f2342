#!/bin/bash
# Reference solution of find-code-held-out-005.
set -euo pipefail
grep -r code /data
echo 2105 > /app/answer.txt
