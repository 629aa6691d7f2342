#!/bin/bash
# Reference solution of the task "dedupe-keep-order".
set -euo pipefail
awk '!seen[$0]++' /app/visits.txt > /app/first-visits.txt
