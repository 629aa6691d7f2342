#!/bin/bash
# Reference solution of run-program-train-043.
set -euo pipefail
/data/bin/fjord 30
echo 269 > /app/answer.txt
