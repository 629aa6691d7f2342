#!/bin/bash
# Reference solution of the task "rename-extension".
set -euo pipefail
for f in /app/notes/*.txt; do
    mv "$f" "${f%.txt}.md"
done
