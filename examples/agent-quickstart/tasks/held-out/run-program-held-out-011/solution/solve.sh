#!/bin/bash
# Reference solution of run-program-held-out-011.
set -euo pipefail
/data/bin/iris 26
echo 253 > /app/answer.txt
