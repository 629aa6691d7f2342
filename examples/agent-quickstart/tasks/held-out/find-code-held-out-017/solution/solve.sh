#!/bin/bash
# Reference solution of find-code-held-out-017.
set -euo pipefail
grep -r code /data
echo 6638 > /app/answer.txt
