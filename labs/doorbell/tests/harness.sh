#!/bin/sh
# The doorbell lab's test plan, run in the guest as root. Environment: SEEDS
# (space-separated), CMDS (commands per CPU in each race run). The protocol
# (the nonce, tagged lines, the end line) is the library's (vm/harness-lib.sh).
# shellcheck source-path=SCRIPTDIR source=../../../vm/harness-lib.sh
. /lib/mmiolab/harness-lib.sh

begin ringdrv 4 "lab=doorbell module=ringdrv"
load_unload "2 single_cpu" "3 race" "4 cost"

seed_fabric "$first_seed"
loaded || load
check /job/ringtest -k 2 -N single_cpu -t 1 -n 200 -s "$first_seed"
unload

# Traced: the first failing seed's trace goes to the host.
race() { traced /job/ringtest -k "$k" -N "seed_$seed" -n "$CMDS" -s "$seed" -i 2; }
# Cost, once the race passed: what the submit path pays to order each
# doorbell, from the fabric's trace events of one more run (ordercost.c).
# mmiowb() only orders the doorbell; a read-back makes it arrive, a round
# trip each time. lab.toml says what each is worth. That run's routes are
# long (cost_route): mmiowb() is traced only when it waits, and under TCG a
# CPU often takes longer than the lab's 1.5-6.5 us to get from the doorbell
# to the flush, the doorbell gone by then; 50 us leaves it queued. The
# lab's routes come back after.
cost_route=50000
if per_seed 3 race race; then
	seed_fabric "$first_seed"
	lab_route=$(sed -n 's/.* \(route_ns=[^ ]*\).*/\1/p' $params)
	if ! set_fabric "route_ns=$cost_route"; then
		say "not ok 4 cost # the fabric refused route_ns=$cost_route"
	elif load; then
		say "# cost: measured with route_ns=$cost_route (the lab's: $lab_route)"
		check /job/ordercost -k 4 -N cost -- /job/ringtest -k 1 -N cost_run -n 2000 \
			-s "$first_seed"
		unload
	else
		say "not ok 4 cost # insmod failed: $(cat /tmp/insmod.err)"
	fi
	set_fabric "$lab_route"
else
	say "not ok 4 cost # not graded: the race test failed"
fi
