#!/bin/bash
# Reference solution of find-code-held-out-008.
set -euo pipefail
grep -r code /data
echo 8014 > /app/answer.txt
