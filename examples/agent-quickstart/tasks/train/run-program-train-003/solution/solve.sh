#!/bin/bash
# Reference solution of run-program-train-003.
set -euo pipefail
/data/bin/alpha 13
echo 104 > /app/answer.txt
