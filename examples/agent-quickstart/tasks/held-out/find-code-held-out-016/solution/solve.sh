#!/bin/bash
# Reference solution of find-code-held-out-016.
set -euo pipefail
grep -r code /data
echo 9911 > /app/answer.txt
