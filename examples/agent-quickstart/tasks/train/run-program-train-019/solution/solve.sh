#!/bin/bash
# Reference solution of run-program-train-019.
set -euo pipefail
/data/bin/cedar 14
echo 72 > /app/answer.txt
