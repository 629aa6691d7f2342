#!/bin/bash
# Reference solution of find-code-held-out-001.
set -euo pipefail
grep -r code /data
echo 5459 > /app/answer.txt
