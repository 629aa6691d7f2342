#!/bin/bash
# Reference solution of find-code-held-out-021.
set -euo pipefail
grep -r code /data
echo 6604 > /app/answer.txt
