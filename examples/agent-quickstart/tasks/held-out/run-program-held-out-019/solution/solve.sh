#!/bin/bash
# Reference solution of run-program-held-out-019.
set -euo pipefail
/data/bin/grove 24
echo 115 > /app/answer.txt
