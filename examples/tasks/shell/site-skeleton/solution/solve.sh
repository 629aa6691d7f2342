#!/bin/bash
# Reference solution of the task "site-skeleton".
set -euo pipefail
mkdir -p /app/site/css /app/site/js /app/site/img
printf '<h1>Home</h1>\n' > /app/site/index.html
