#!/bin/bash
# Reference solution of the task "env-to-exports".
set -euo pipefail
sed 's/^/export /' /app/settings.env > /app/settings.sh
