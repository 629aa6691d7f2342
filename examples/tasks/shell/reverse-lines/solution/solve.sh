#!/bin/bash
# Reference solution of the task "reverse-lines".
set -euo pipefail
tac /app/steps.txt > /app/reversed.txt
