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
race() { traced /job/ringtest -k "$k" -N "seed_$seed" -n "$CMDS" -s "$seed" -i 2 -c /tmp/cost; }
rm -f /tmp/cost
# Cost: reads per command on the submit path. A read-back fix is correct
# but pays a round trip per doorbell; mmiowb() only orders.
if per_seed 3 race race; then
	awk '{ r += $1; w += $2; n += $3; t += $4 }
	END {
		rpc = n ? r / n : 0; wpc = n ? w / n : 0
		flush = rpc > 0.5 ? "readback" : (wpc > 0.5 ? "mmiowb" : "none")
		# No flush seen: no cost marks (report.py enforces it too); the
		# grader flags the submission for the instructor to read.
		frac = rpc > 0.5 ? "0.5" : (wpc > 0.5 ? "1" : "0"); thr = NR ? t / NR : 0
		printf "# cost: flush=%s reads_per_cmd=%.3f mmiowbs_per_cmd=%.3f throughput_cps=%.0f fraction=%s\n", flush, rpc, wpc, thr, frac
		print "ok 4 cost"
	}' /tmp/cost | tag
else
	say "not ok 4 cost # not graded: the race test failed"
fi
