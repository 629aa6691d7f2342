#!/bin/bash
# Reference solution of run-program-train-023.
set -euo pipefail
/data/bin/ember 19
echo 126 > /app/answer.txt
