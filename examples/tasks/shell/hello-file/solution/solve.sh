#!/bin/bash
# Reference solution of the task "hello-file".
set -euo pipefail
printf 'Hello, world!\n' > /app/hello.txt
