#!/usr/bin/env bash
# Gradescope runs this for each submission: grade /autograder/submission into
# /autograder/results/results.json. MMIOLAB_AUTOGRADER moves /autograder (tests).
set -euo pipefail
root=${MMIOLAB_AUTOGRADER:-/autograder}
exec /usr/bin/python3 "$root/source/scripts/grade" --lab @lab@ --gradescope@flags@
