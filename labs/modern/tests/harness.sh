#!/bin/sh
# The modern lab's test plan, run in the guest as root. Environment: SEEDS
# (space-separated), CMDS (commands per CPU in each race run), RACE_ONLY
# (the test suite's, below). The protocol
# (the nonce, tagged lines, the end line) is the library's (vm/harness-lib.sh).
# shellcheck source-path=SCRIPTDIR source=../../../vm/harness-lib.sh
. /lib/mmiolab/harness-lib.sh
# KTAP number, test name and submit path (RINGDRV_PATH_* in ringdrv_ioctl.h)
PATHS="3:unlock:1 4:relaxed:2 5:mutex:3"
split() { n=${1%%:*}; rest=${1#*:}; name=${rest%%:*}; path=${rest#*:}; }

begin ringdrv 5 "lab=modern module=ringdrv"
set -- "2 single_cpu"
for p in $PATHS; do
	split "$p"
	set -- "$@" "$n $name"
done
load_unload "$@"

# One CPU, every path: nothing to reorder, so every path must work.
seed_fabric "$first_seed"
loaded || load
say "  KTAP version 1"
say "  # Subtest: single_cpu"
say "  1..3"
single=ok
k=0
for p in $PATHS; do
	split "$p"
	k=$((k + 1))
	check /job/ringtest -k "$k" -N "$name" -t 1 -n 200 -s "$first_seed" -m "$path" -i 2 || single="not ok"
done
say "$single 2 single_cpu"
unload

# All CPUs on one path at a time, once per seed. Traced: the first failing
# run's trace goes to the host. RACE_ONLY (names, space-separated; unset:
# every path) is the test suite's: a wrong fix breaks one path, and the
# suite races only that one (tests/test_labs.py). The grader never sets it.
race() { traced /job/ringtest -k "$k" -N "seed_$seed" -n "$CMDS" -s "$seed" -m "$path" -i 2; }
for p in $PATHS; do
	split "$p"
	case " ${RACE_ONLY:-$name} " in
	*" $name "*) per_seed "$n" "$name" race ;;
	*) say "ok $n $name # SKIP not run: RACE_ONLY=$RACE_ONLY" ;;
	esac
done
