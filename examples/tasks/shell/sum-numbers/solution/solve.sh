#!/bin/bash
# Reference solution of the task "sum-numbers".
set -euo pipefail
awk '{ total += $1 } END { print total }' /app/numbers.txt > /app/total.txt
