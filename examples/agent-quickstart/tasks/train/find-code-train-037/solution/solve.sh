#!/bin/bash
# Reference solution of find-code-train-037.
set -euo pipefail
grep -r code /data
echo 2877 > /app/answer.txt
