#!/bin/bash
# Reference solution of the task "count-errors".
set -euo pipefail
grep -c 'ERROR' /app/app.log > /app/errors.txt
