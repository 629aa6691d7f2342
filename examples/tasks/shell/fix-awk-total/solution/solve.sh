#!/bin/bash
# Reference solution of the task "fix-awk-total".
set -euo pipefail
sed -i 's/\$2 + \$3/$2 * $3/' /app/total.awk
