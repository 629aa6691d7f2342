#!/bin/bash
# Reference solution of run-program-held-out-015.
set -euo pipefail
/data/bin/grove 18
echo 46 > /app/answer.txt
