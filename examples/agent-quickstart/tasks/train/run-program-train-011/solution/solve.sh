#!/bin/bash
# Reference solution of run-program-train-011.
set -euo pipefail
/data/bin/delta 20
echo 230 > /app/answer.txt
