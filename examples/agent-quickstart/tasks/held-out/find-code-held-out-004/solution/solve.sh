#!/bin/bash
# Reference solution of find-code-held-out-004.
set -euo pipefail
grep -r code /data
echo 2883 > /app/answer.txt
