#!/bin/bash
# Reference solution of the task "private-key-mode".
set -euo pipefail
chmod 600 /app/secret.key
