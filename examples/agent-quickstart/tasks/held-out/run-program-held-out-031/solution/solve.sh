#!/bin/bash
# Reference solution of run-program-held-out-031.
set -euo pipefail
/data/bin/delta 28
echo 190 > /app/answer.txt
