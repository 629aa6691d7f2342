#!/bin/bash
# Reference solution of the task "make-executable".
set -euo pipefail
chmod 755 /app/run.sh
