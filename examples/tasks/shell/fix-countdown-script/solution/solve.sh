#!/bin/bash
# Reference solution of the task "fix-countdown-script".
set -euo pipefail
printf '#!/bin/sh\nfor i in 3 2 1; do\n  echo "$i"\ndone\necho liftoff\n' > /app/countdown.sh
