#!/bin/bash
# Reference solution of the task "count-words".
set -euo pipefail
wc -w < /app/poem.txt > /app/words.txt
