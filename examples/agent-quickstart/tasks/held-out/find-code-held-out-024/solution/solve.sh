#!/bin/bash
# Reference solution of find-code-held-out-024.
set -euo pipefail
grep -r code /data
echo 7408 > /app/answer.txt
