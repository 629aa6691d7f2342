#!/bin/bash
# Reference solution of find-code-held-out-000.
set -euo pipefail
grep -r code /data
echo 3623 > /app/answer.txt
