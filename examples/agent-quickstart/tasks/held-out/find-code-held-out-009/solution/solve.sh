#!/bin/bash
# Reference solution of find-code-held-out-009.
set -euo pipefail
grep -r code /data
echo 7252 > /app/answer.txt
