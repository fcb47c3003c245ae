#!/bin/sh
# The doorbell lab's hidden tests, run in a second guest (hidden.toml: four
# CPUs, other routes). Same protocol as ../tests/harness.sh: the nonce comes
# from /job/nonce, the test programs print plain KTAP and the harness tags
# it. Environment: SEEDS, CMDS (commands per CPU in a visible race run: the
# same total, spread over four CPUs, per seed; four times as many in the long run).
ch=/dev/ttyS1
read -r nonce < /job/nonce
rm -f /job/nonce /job/run
params=/sys/kernel/debug/mmiosim/params
say() { printf '%s %s\n' "$nonce" "$*" > "$ch"; }
tag() { while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$nonce" "$line"; done > "$ch"; }
check() { "$@" > /tmp/out; rc=$?; tag < /tmp/out; return $rc; }
trap 'say "# mmiolab harness: end"' EXIT
load() { insmod /job/ringdrv.ko 2>/tmp/insmod.err; }
unload() { rmmod ringdrv 2>/tmp/rmmod.err; }

say "KTAP version 1"
say "1..2"
say "# mmiolab harness: lab=doorbell hidden cpus=$(nproc) seeds=$SEEDS $(cat $params)"

# shellcheck disable=SC2086 # one word per seed
set -- $SEEDS
say "  KTAP version 1"
say "  # Subtest: race_4cpu"
say "  1..$#"
k=0
race=ok
for seed in $SEEDS; do
	k=$((k + 1))
	echo "seed=$seed" > $params
	if ! load; then
		say "  not ok $k seed_$seed # insmod failed: $(cat /tmp/insmod.err)"
		race="not ok"
		continue
	fi
	check /job/ringtest -k "$k" -N "seed_$seed" -n $((CMDS / 2)) -s "$seed" -i 2 || race="not ok"
	unload || race="not ok"
done
say "$race 1 race_4cpu"

echo "seed=$1" > $params
if load; then
	check /job/ringtest -k 2 -N race_long -n $((CMDS * 2)) -s "$1" && unload
else
	say "not ok 2 race_long # insmod failed: $(cat /tmp/insmod.err)"
fi
