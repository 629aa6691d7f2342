#!/bin/bash
# Reference solution of run-program-held-out-003.
set -euo pipefail
/data/bin/delta 7
echo 64 > /app/answer.txt
