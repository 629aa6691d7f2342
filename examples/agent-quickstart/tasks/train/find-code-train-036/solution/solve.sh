#!/bin/bash
# Reference solution of find-code-train-036.
set -euo pipefail
grep -r code /data
echo 3422 > /app/answer.txt
