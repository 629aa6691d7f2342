#!/bin/bash
# Reference solution of the task "extract-column".
set -euo pipefail
tail -n +2 /app/people.csv | cut -d, -f3 > /app/cities.txt
