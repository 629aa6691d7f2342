#!/bin/bash
# Reference solution of run-program-train-039.
set -euo pipefail
/data/bin/juniper 4
echo 63 > /app/answer.txt
