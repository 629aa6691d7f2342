#!/bin/bash
# Reference solution of the task "tar-create".
set -euo pipefail
tar -czf /app/project.tar.gz -C /app project
