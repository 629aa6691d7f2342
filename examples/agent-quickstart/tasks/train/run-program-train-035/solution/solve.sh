#!/bin/bash
# Reference solution of run-program-train-035.
set -euo pipefail
/data/bin/ember 21
echo 78 > /app/answer.txt
