#!/bin/bash
# Reference solution of run-program-held-out-023.
set -euo pipefail
/data/bin/harbor 21
echo 67 > /app/answer.txt
