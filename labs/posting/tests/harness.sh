#!/bin/sh
# The posting lab's test plan, run in the guest as root. Result lines go to
# the harness channel (/dev/ttyS1), each prefixed with the run's nonce; the
# host ignores everything else. Environment: NONCE, SEEDS (space-separated),
# CYCLES (sessions per seed in the teardown test, default 200).
ch=/dev/ttyS1
rm -f /job/run	# the nonce is for this script only
params=/sys/kernel/debug/mmiosim/params
cycles=${CYCLES:-200}
say() { echo "$NONCE $*" > "$ch"; }
load() { insmod /job/postdrv.ko 2>/tmp/insmod.err; }
unload() { rmmod postdrv 2>/tmp/rmmod.err; }

say "KTAP version 1"
say "1..3"
say "# mmiolab harness: lab=posting module=postdrv cpus=$(nproc) seeds=$SEEDS $(cat $params)"

if ! load; then
	say "# load_unload: insmod postdrv.ko failed: $(cat /tmp/insmod.err)"
	say "not ok 1 load_unload"
	for t in "2 complete" "3 teardown"; do say "not ok $t # not run: the driver did not load"; done
	exit 0
fi
if [ ! -c /dev/postdrv ]; then
	say "# load_unload: the driver loaded but /dev/postdrv did not appear"
	say "not ok 1 load_unload"
	for t in "2 complete" "3 teardown"; do say "not ok $t # not run: no /dev/postdrv"; done
	exit 0
fi
if unload; then
	say "# load_unload: insmod postdrv.ko: ok; rmmod postdrv: ok"
	say "ok 1 load_unload"
else
	say "# load_unload: rmmod postdrv failed: $(cat /tmp/rmmod.err)"
	say "not ok 1 load_unload"
fi

# Sessions that wait for their commands before STOP: nothing is in flight
# when the driver tears down, so even the starter passes.
# shellcheck disable=SC2086 # one word per seed
set -- $SEEDS
echo "seed=$1" > $params
lsmod | grep -q '^postdrv ' || load
/job/posttest -k 2 -N complete -n 20 -w slowest -s "$1" -p "$NONCE" > "$ch"
unload

say "  KTAP version 1"
say "  # Subtest: teardown"
say "  1..$#"
k=0
verdict=ok
for seed in $SEEDS; do
	k=$((k + 1))
	echo "seed=$seed" > $params
	if ! load; then
		say "  not ok $k seed_$seed # insmod failed"
		verdict="not ok"
		continue
	fi
	/job/posttest -k "$k" -N "seed_$seed" -n "$cycles" -s "$seed" -p "$NONCE" -i 2 > "$ch" || verdict="not ok"
	unload || verdict="not ok"
done
say "$verdict 3 teardown"
