#!/bin/sh
# The modern lab's test plan, run in the guest as root. Environment: SEEDS
# (space-separated), CMDS (commands per CPU in each race run).
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
say() { printf '%s %s\n' "$nonce" "$*" > "$ch"; }
tag() { while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$nonce" "$line"; done > "$ch"; }
# Run a test program, then pass its output on, tagged; returns its status.
check() { "$@" > /tmp/out; rc=$?; tag < /tmp/out; return $rc; }
trap 'say "# mmiolab harness: end"' EXIT
load() { insmod /job/ringdrv.ko 2>/tmp/insmod.err; }
unload() { rmmod ringdrv 2>/tmp/rmmod.err; }
# KTAP number, test name and submit path (RINGDRV_PATH_* in ringdrv_ioctl.h)
PATHS="3:unlock:1 4:relaxed:2 5:mutex:3"
split() { n=${1%%:*}; rest=${1#*:}; name=${rest%%:*}; path=${rest#*:}; }

say "KTAP version 1"
say "1..5"
say "# mmiolab harness: lab=modern module=ringdrv cpus=$(nproc) seeds=$SEEDS $(cat $params)"

not_run() {
	say "not ok 2 single_cpu # not run: $1"
	for p in $PATHS; do
		split "$p"
		say "not ok $n $name # not run: $1"
	done
}

if ! load; then
	say "# load_unload: insmod ringdrv.ko failed: $(cat /tmp/insmod.err)"
	say "not ok 1 load_unload"
	not_run "the driver did not load"
	exit 0
fi
if [ ! -c /dev/ringdrv ]; then
	say "# load_unload: the driver loaded but /dev/ringdrv did not appear"
	say "not ok 1 load_unload"
	not_run "no /dev/ringdrv"
	exit 0
fi
if unload; then
	say "# load_unload: insmod ringdrv.ko: ok; rmmod ringdrv: ok"
	say "ok 1 load_unload"
else
	say "# load_unload: rmmod ringdrv failed: $(cat /tmp/rmmod.err) (module refcnt $(cat /sys/module/ringdrv/refcnt 2>&1))"
	say "not ok 1 load_unload"
fi

# One CPU, every path: nothing to reorder, so every path must work.
# shellcheck disable=SC2086 # one word per seed
set -- $SEEDS
echo "seed=$1" > $params
lsmod | grep -q '^ringdrv ' || load
say "  KTAP version 1"
say "  # Subtest: single_cpu"
say "  1..3"
single=ok
k=0
for p in $PATHS; do
	split "$p"
	k=$((k + 1))
	check /job/ringtest -k "$k" -N "$name" -t 1 -n 200 -s "$1" -m "$path" -i 2 || single="not ok"
done
say "$single 2 single_cpu"
unload

# All CPUs on one path at a time, once per seed. Traced; the first failing
# run's trace goes to the host, for the report's picture (vm/record).
send=fail
for p in $PATHS; do
	split "$p"
	say "  KTAP version 1"
	say "  # Subtest: $name"
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
		check env RECORD_SEND="$send" RECORD_KB=512 record /job/ringtest -k "$k" -N "seed_$seed" \
			-n "$CMDS" -s "$seed" -m "$path" -i 2 || { verdict="not ok"; send=never; }
		unload || verdict="not ok"
	done
	say "$verdict $n $name"
done
