#!/bin/bash
# Reference solution of the task "clean-tmp-files".
set -euo pipefail
find /app/cache -type f -name '*.tmp' -delete
