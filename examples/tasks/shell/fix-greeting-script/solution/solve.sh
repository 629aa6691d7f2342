#!/bin/bash
# Reference solution of the task "fix-greeting-script".
set -euo pipefail
sed -i 's/\$nmae/$name/' /app/greet.sh
