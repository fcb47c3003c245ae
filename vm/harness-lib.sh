# shellcheck shell=dash
# The guest's half of the harness protocol (scripts/mmiolab/lab.py), in one
# place. Every lab's tests/harness.sh and hidden/harness.sh begins with
#
#   . /lib/mmiolab/harness-lib.sh
#
# and keeps only its lab's tests. Sourcing this reads the run's nonce from
# /job/nonce into an unexported variable and deletes the file (and the job
# script) before anything else runs, so no process the harness starts
# (insmod, the test programs) finds the nonce in its environment, its
# arguments or a file. The host trusts only lines on the harness channel
# that start with the nonce (say, tag, check), and counts the run as finished
# only when the end line arrives: this shell prints it as it exits. Until
# then a subshell sends the progress heartbeat (below).
#
# Environment: SEEDS (space-separated). For the harness: $first_seed,
# $nseeds; per_seed sets $k and $seed for the command it runs.

ch=/dev/ttyS1
unset nonce             # (an inherited nonce would be exported)
read -r nonce < /job/nonce
rm -f /job/nonce /job/run
params=/sys/kernel/debug/mmiosim/params
progress=/tmp/progress
: > $progress
# The progress heartbeat: once a second, what the test programs last wrote
# to $progress (vm/guest/progress.h: the commands or sessions done), tagged.
# The host (vm.py) calls a run stuck when this stops changing, and slow,
# not stuck, while it moves; it buys patience up to the run's ceiling and
# never scores. A subshell of this one: it holds the nonce no less, and
# no more, than the harness does; it stops with the harness, also one
# killed (labstats' batches stop a variant that outlasts its time).
heartbeat() {
	while sleep 1 && kill -0 $$ 2>/dev/null; do
		read -r _done < $progress || _done=
		say "# mmiolab progress ${_done:-0}"
	done
}

# shellcheck disable=SC2086 # one word per seed
set -- $SEEDS
# shellcheck disable=SC2034 # for the harness
nseeds=$# first_seed=${1:-}

# say TEXT: one line on the channel, tagged; tag: each line of stdin.
say() { printf '%s %s\n' "$nonce" "$*" > "$ch"; }
tag() { while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$nonce" "$line"; done > "$ch"; }
# check CMD...: run a test program, then pass its output on, tagged; returns its status.
check() { "$@" > /tmp/out; rc=$?; tag < /tmp/out; return $rc; }
# The guest's CPU time (the /proc/stat "cpu" line: user nice system idle
# iowait irq softirq..., in USER_HZ ticks of the guest's clock) when the
# harness starts and when it ends, in one diagnostic line before the end
# line, for the grading benchmark (scripts/mmiolab/gradebench.py: guest user
# and kernel time). Cheap: two reads by the shell itself, no process. The
# grader ignores it (a diagnostic after the last test, the KTAP root's log).
read -r cpu_start < /proc/stat
guest_cpu() { read -r _cpu_end < /proc/stat; say "# mmiolab guest cpu: start $cpu_start; end $_cpu_end"; }
heartbeat &
heartbeat_pid=$!
# The end line on a line of its own: a heartbeat killed in the middle of its
# write leaves half a line, which the end line must not be appended to.
trap 'kill $heartbeat_pid 2>/dev/null; wait $heartbeat_pid 2>/dev/null; printf "\n" > "$ch"; fabric_line; guest_cpu; say "# mmiolab harness: end"' EXIT
# traced CMD...: check CMD under vm/record; the first failing run's trace goes
# to the host, for the report's picture of the race (RECORD_SEND=fail).
# TRACE_SEND=never (labtest's batches, which count failures and draw no
# picture) sends none: the runs are traced as graded, but no trace is
# formatted, compressed and sent, seconds of emulated CPU per failing variant.
send=${TRACE_SEND:-fail}
traced() { check env RECORD_SEND="$send" RECORD_KB=512 record "$@" || { send=never; return 1; }; }

load() { insmod "/job/$module.ko" 2>/tmp/insmod.err; }
unload() { rmmod "$module" 2>/tmp/rmmod.err; }
loaded() { lsmod | grep -q "^$module "; }
# set_fabric WORDS: change the fabric's settings (NAME=VALUE words), and
# count the change. The kernel counts every change as well (changes=N in
# $params, in memory a driver cannot store to), so a change this harness
# did not make is seen even if it was put back before the settings were
# read again. Every write to $params goes through here.
harness_changes=0
set_fabric() { echo "$1" > $params && harness_changes=$((harness_changes + 1)); }
# seed_fabric SEED: the fabric's PRNG seed for the next runs.
seed_fabric() { fabric_seed=$1; set_fabric "seed=$1"; }
# fabric_line [INDENT]: the fabric's settings read again, with the seed this
# harness set last and the number of changes it made. The host compares
# them with the begin line's, read before any driver was loaded, and flags
# a run in which they changed, or in which the kernel counted more changes
# than the harness made (scripts/mmiolab/guestout.py): a driver cannot
# store to them (the kernel keeps them read-only after boot), so a change
# took something else.
fabric_line() { say "${1:-}# mmiolab fabric: set_seed=${fabric_seed:-} harness_changes=$harness_changes $(cat $params 2>&1)"; }

# begin MODULE TESTS WHAT: the driver's module name, the KTAP header (TESTS
# tests) and the harness's own line (WHAT: lab=LAB ...), which the host reads.
begin() {
	module=$1
	say "KTAP version 1"
	say "1..$2"
	say "# mmiolab harness: $3 cpus=$(nproc) seeds=$SEEDS $(cat $params)"
}

# load_unload ["N NAME"...]: test 1, the driver loads, makes /dev/MODULE and
# unloads. If it does not load or make its device, the tests named are
# reported not run and the harness ends.
load_unload() {
	if ! load; then
		say "# load_unload: insmod $module.ko failed: $(cat /tmp/insmod.err)"
		say "not ok 1 load_unload"
		for t; do say "not ok $t # not run: the driver did not load"; done
		exit 0
	fi
	if [ ! -c "/dev/$module" ]; then
		say "# load_unload: the driver loaded but /dev/$module did not appear"
		say "not ok 1 load_unload"
		for t; do say "not ok $t # not run: no /dev/$module"; done
		exit 0
	fi
	if unload; then
		say "# load_unload: insmod $module.ko: ok; rmmod $module: ok"
		say "ok 1 load_unload"
	else
		say "# load_unload: rmmod $module failed: $(cat /tmp/rmmod.err)" \
			"(module refcnt $(cat "/sys/module/$module/refcnt" 2>&1))"
		say "not ok 1 load_unload"
	fi
}

# per_seed N NAME CMD...: test N, NAME, a subtest of one run per seed, each on
# the driver freshly loaded: CMD ($k the run's number, $seed its seed) must
# succeed and the driver unload. Returns whether every run passed.
per_seed() {
	_n=$1 _name=$2
	shift 2
	say "  KTAP version 1"
	say "  # Subtest: $_name"
	say "  1..$nseeds"
	k=0
	_verdict=ok
	for seed in $SEEDS; do
		k=$((k + 1))
		seed_fabric "$seed"
		if ! load; then
			say "  not ok $k seed_$seed # insmod failed: $(cat /tmp/insmod.err)"
			_verdict="not ok"
			continue
		fi
		"$@" || _verdict="not ok"
		fabric_line "  "
		unload || _verdict="not ok"
	done
	say "$_verdict $_n $_name"
	[ "$_verdict" = ok ]
}
