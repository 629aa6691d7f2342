#!/bin/bash
# Reference solution of the task "uppercase".
set -euo pipefail
tr 'a-z' 'A-Z' < /app/quote.txt > /app/QUOTE.txt
