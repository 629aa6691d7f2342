#!/bin/bash
# Reference solution of the task "tar-extract".
set -euo pipefail
mkdir -p /app/unpacked
tar -xf /app/bundle.tar -C /app/unpacked
