#!/bin/bash
# Reference solution of the task "largest-file".
set -euo pipefail
ls -S /app/files | head -n 1 > /app/largest.txt
