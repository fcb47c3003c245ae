#!/bin/sh
# The modern lab's hidden tests, run in a second guest (hidden.toml: four
# CPUs, other routes), under the same protocol as ../tests/harness.sh.
# Environment: SEEDS, CMDS (commands per CPU in a visible race run: here the
# same total per seed over four CPUs, twice that on the mutex path).
# shellcheck source-path=SCRIPTDIR source=../../../vm/harness-lib.sh
. /lib/mmiolab/harness-lib.sh
# number:name:path (RINGDRV_PATH_*):commands per CPU
per_cpu=${CMDS:?}
PATHS="1:unlock_4cpu:1:$((per_cpu / 2)) 2:relaxed_4cpu:2:$((per_cpu / 2)) 3:mutex_4cpu:3:$per_cpu"
split() {
	n=${1%%:*}; rest=${1#*:}; name=${rest%%:*}; rest=${rest#*:}
	path=${rest%%:*}; cmds=${rest#*:}
}

begin ringdrv 3 "lab=modern hidden"

race() { check /job/ringtest -k "$k" -N "seed_$seed" -n "$cmds" -s "$seed" -m "$path" -i 2; }
for p in $PATHS; do
	split "$p"
	per_seed "$n" "$name" race
done
