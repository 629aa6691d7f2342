#!/bin/bash
# Reference solution of run-program-train-047.
set -euo pipefail
/data/bin/birch 7
echo 69 > /app/answer.txt
