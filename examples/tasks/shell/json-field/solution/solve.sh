#!/bin/bash
# Reference solution of the task "json-field".
set -euo pipefail
sed -n 's/.*"email": *"\([^"]*\)".*/\1/p' /app/user.json > /app/email.txt
