#!/bin/bash
# Reference solution of the task "count-lines".
set -euo pipefail
wc -l < /app/access.log > /app/count.txt
