#!/bin/bash
# Reference solution of the task "sort-unique".
set -euo pipefail
sort -u /app/names.txt > /app/unique.txt
