#!/bin/bash
# Reference solution of run-program-train-031.
set -euo pipefail
/data/bin/harbor 24
echo 71 > /app/answer.txt
