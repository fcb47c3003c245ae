#!/usr/bin/env bash
# Gradescope runs this for each submission: grade /autograder/submission into
# /autograder/results/results.json. MMIOLAB_AUTOGRADER moves /autograder (tests).
# The grader stops before Gradescope's default timeout (600 s), with its reason
# in this job's output; where the assignment's timeout was raised, say so here:
#   export MMIOLAB_TIME_LIMIT=1200
set -euo pipefail
root=${MMIOLAB_AUTOGRADER:-/autograder}
exec /usr/bin/python3 "$root/source/scripts/grade" --lab @lab@ --gradescope@flags@
