#!/bin/bash
# Reference solution of count-matches-train-026.
set -euo pipefail
grep -c WARN /data/harbor.log
echo 6 > /app/answer.txt
