#!/bin/sh
# The doorbell lab's hidden tests, run in a second guest (hidden.toml: four
# CPUs, other routes), under the same protocol as ../tests/harness.sh.
# Environment: SEEDS, CMDS (commands per CPU in a visible race run: the
# same total, spread over four CPUs, per seed; twice as many in the long run).
# shellcheck source-path=SCRIPTDIR source=../../../vm/harness-lib.sh
. /lib/mmiolab/harness-lib.sh

begin ringdrv 2 "lab=doorbell hidden"

race() { check /job/ringtest -k "$k" -N "seed_$seed" -n $((CMDS / 2)) -s "$seed" -i 2; }
per_seed 1 race_4cpu race

seed_fabric "$first_seed"
if load; then
	check /job/ringtest -k 2 -N race_long -n "$CMDS" -s "$first_seed" && unload
else
	say "not ok 2 race_long # insmod failed: $(cat /tmp/insmod.err)"
fi
