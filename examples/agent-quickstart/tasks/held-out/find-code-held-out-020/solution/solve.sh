#!/bin/bash
# Reference solution of find-code-held-out-020.
set -euo pipefail
grep -r code /data
echo 7883 > /app/answer.txt
