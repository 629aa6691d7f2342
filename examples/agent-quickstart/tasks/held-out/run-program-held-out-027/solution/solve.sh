#!/bin/bash
# Reference solution of run-program-held-out-027.
set -euo pipefail
/data/bin/harbor 4
echo 49 > /app/answer.txt
