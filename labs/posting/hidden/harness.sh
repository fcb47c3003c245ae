#!/bin/sh
# The posting lab's hidden tests, run in a second guest (hidden.toml: four
# CPUs, other routes). Same protocol as ../tests/harness.sh. Environment:
# SEEDS, CYCLES (sessions per seed in the visible teardown test, default 1000).
ch=/dev/ttyS1
read -r nonce < /job/nonce
rm -f /job/nonce /job/run
params=/sys/kernel/debug/mmiosim/params
cycles=${CYCLES:-1000}
far=$(($(nproc) - 1))
say() { printf '%s %s\n' "$nonce" "$*" > "$ch"; }
tag() { while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$nonce" "$line"; done > "$ch"; }
check() { "$@" > /tmp/out; rc=$?; tag < /tmp/out; return $rc; }
trap 'say "# mmiolab harness: end"' EXIT
load() { insmod /job/postdrv.ko 2>/tmp/insmod.err; }
unload() { rmmod postdrv 2>/tmp/rmmod.err; }

say "KTAP version 1"
say "1..2"
say "# mmiolab harness: lab=posting hidden cpus=$(nproc) seeds=$SEEDS $(cat $params)"

# shellcheck disable=SC2086 # one word per seed
set -- $SEEDS
say "  KTAP version 1"
say "  # Subtest: teardown_far_cpu"
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
	check /job/posttest -k "$k" -N "seed_$seed" -n "$cycles" -s "$seed" -i 2 -c "$far" || verdict="not ok"
	unload || verdict="not ok"
done
say "$verdict 1 teardown_far_cpu"

echo "seed=$1" > $params
if load; then
	check /job/posttest -k 2 -N teardown_long -n $((cycles * 4)) -s "$1" -c 1 && unload
else
	say "not ok 2 teardown_long # insmod failed"
fi
