#!/bin/sh
# The posting lab's hidden tests, run in a second guest (hidden.toml: four
# CPUs, other routes), under the same protocol as ../tests/harness.sh.
# Environment: SEEDS, CYCLES (sessions per seed in the visible teardown test,
# default 750, as there).
# shellcheck source-path=SCRIPTDIR source=../../../vm/harness-lib.sh
. /lib/mmiolab/harness-lib.sh
cycles=${CYCLES:-750}
far=$(($(nproc) - 1))

begin postdrv 2 "lab=posting hidden"

teardown() { check /job/posttest -k "$k" -N "seed_$seed" -n "$cycles" -s "$seed" -i 2 -c "$far"; }
per_seed 1 teardown_far_cpu teardown

seed_fabric "$first_seed"
if load; then
	check /job/posttest -k 2 -N teardown_long -n $((cycles * 2)) -s "$first_seed" -c 1 && unload
else
	say "not ok 2 teardown_long # insmod failed"
fi
