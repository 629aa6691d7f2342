#!/bin/bash
# Reference solution of find-code-held-out-012.
set -euo pipefail
grep -r code /data
echo 4638 > /app/answer.txt
