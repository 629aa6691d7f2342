#!/bin/bash
# Reference solution of run-program-held-out-007.
set -euo pipefail
/data/bin/harbor 8
echo 45 > /app/answer.txt
