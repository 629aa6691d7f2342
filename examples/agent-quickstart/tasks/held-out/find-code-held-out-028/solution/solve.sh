#!/bin/bash
# Reference solution of find-code-held-out-028.
set -euo pipefail
grep -r code /data
echo 5868 > /app/answer.txt
