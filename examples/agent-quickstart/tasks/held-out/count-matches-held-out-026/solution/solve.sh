#!/bin/bash
# Reference solution of count-matches-held-out-026.
set -euo pipefail
grep -c INFO /data/juniper.log
echo 3 > /app/answer.txt
