#!/bin/bash
# Reference solution of find-code-held-out-025.
set -euo pipefail
grep -r code /data
echo 7850 > /app/answer.txt
