#!/bin/bash
# Reference solution of the task "replace-host".
set -euo pipefail
sed -i 's/localhost/db.internal/g' /app/app.conf
