#!/bin/sh
# The posting lab's test plan, run in the guest as root. Environment: SEEDS
# (space-separated), CYCLES (sessions per seed in the teardown test, default 1000).
#
# Protocol (scripts/mmiolab/lab.py): the host trusts only lines on the harness
# channel (/dev/ttyS1) that start with this run's nonce, and counts the run as
# finished only when the nonce-marked end line arrives. The nonce is read from
# /job/nonce into an unexported variable and the file is deleted before the
# driver is loaded, so no child process (insmod, the test programs) has it in
# its environment or argv; the test programs print plain KTAP and the harness
# adds the nonce (tag).
ch=/dev/ttyS1
read -r nonce < /job/nonce
rm -f /job/nonce /job/run
params=/sys/kernel/debug/mmiosim/params
cycles=${CYCLES:-1000}
say() { printf '%s %s\n' "$nonce" "$*" > "$ch"; }
tag() { while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$nonce" "$line"; done > "$ch"; }
# Run a test program, then pass its output on, tagged; returns its status.
check() { "$@" > /tmp/out; rc=$?; tag < /tmp/out; return $rc; }
trap 'say "# mmiolab harness: end"' EXIT
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
	say "# load_unload: rmmod postdrv failed: $(cat /tmp/rmmod.err) (module refcnt $(cat /sys/module/postdrv/refcnt 2>&1))"
	say "not ok 1 load_unload"
fi

# Sessions that wait for their commands before STOP: nothing is in flight
# when the driver tears down, so even the starter passes.
# shellcheck disable=SC2086 # one word per seed
set -- $SEEDS
echo "seed=$1" > $params
lsmod | grep -q '^postdrv ' || load
check /job/posttest -k 2 -N complete -n 20 -w slowest -s "$1"
unload

say "  KTAP version 1"
say "  # Subtest: teardown"
say "  1..$#"
k=0
verdict=ok
send=fail
for seed in $SEEDS; do
	k=$((k + 1))
	echo "seed=$seed" > $params
	if ! load; then
		say "  not ok $k seed_$seed # insmod failed"
		verdict="not ok"
		continue
	fi
	# Traced; the first failing seed's trace goes to the host, for the
	# report's picture (vm/record, RECORD_SEND=fail).
	check env RECORD_SEND="$send" RECORD_KB=512 record /job/posttest -k "$k" -N "seed_$seed" \
		-n "$cycles" -s "$seed" -i 2 || { verdict="not ok"; send=never; }
	unload || verdict="not ok"
done
say "$verdict 3 teardown"
