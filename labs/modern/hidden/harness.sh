#!/bin/sh
# The modern lab's hidden tests, run in a second guest (hidden.toml: four
# CPUs, other routes). Same protocol as ../tests/harness.sh. Environment:
# SEEDS, CMDS (commands per CPU in a visible race run: here the same total
# per seed over four CPUs, twice that on the mutex path).
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
# number:name:path (RINGDRV_PATH_*):commands per CPU
per_cpu=${CMDS:?}
PATHS="1:unlock_4cpu:1:$((per_cpu / 2)) 2:relaxed_4cpu:2:$((per_cpu / 2)) 3:mutex_4cpu:3:$per_cpu"
split() {
	n=${1%%:*}; rest=${1#*:}; name=${rest%%:*}; rest=${rest#*:}
	path=${rest%%:*}; cmds=${rest#*:}
}

say "KTAP version 1"
say "1..3"
say "# mmiolab harness: lab=modern hidden cpus=$(nproc) seeds=$SEEDS $(cat $params)"

# shellcheck disable=SC2086 # one word per seed
set -- $SEEDS
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
		check /job/ringtest -k "$k" -N "seed_$seed" -n "$cmds" -s "$seed" -m "$path" -i 2 || verdict="not ok"
		unload || verdict="not ok"
	done
	say "$verdict $n $name"
done
