#!/usr/bin/env bash
# PrairieLearn runs this in a fresh container for each submission: put the
# lab's hidden tests (the question's tests/hidden/, never in this public
# image) into the kit, grade /grade/student, write /grade/results/results.json.
# MMIOLAB_PRAIRIELEARN moves /grade and MMIOLAB_KIT the kit (tests).
set -euo pipefail
grade=${MMIOLAB_PRAIRIELEARN:-/grade}
kit=${MMIOLAB_KIT:-@kit@}
results=$grade/results/results.json
mkdir -p "$grade/results"
rm -f "$results"

# PrairieLearn reads results.json only when this exits 0 (grader-host), so a
# grader that cannot run still says so, as "not gradable": no attempt is lost.
not_gradable() {
	echo "mmiolab: $1" >&2
	printf '{"gradable": false, "score": 0, "message": "%s"}\n' \
		"The grader could not run, through no fault of your code: it is not counted. Tell the course staff." \
		>"$results"
	exit 0
}

hidden=$kit/labs/@lab@/hidden
hidden_tests=@has_hidden@
if [ "$hidden_tests" = yes ]; then
	[ -f "$grade/tests/hidden/hidden.toml" ] ||
		not_gradable "the question has no tests/hidden/hidden.toml: copy the packed question whole"
	rm -rf "$hidden"
	cp -R "$grade/tests/hidden" "$hidden"
	# The grader's (root's) alone, whatever confines the build.
	chmod -R go-rwx "$hidden" "$grade/tests"
fi
status=0
/usr/bin/python3 "$kit/scripts/grade" --lab @lab@ --prairielearn@flags@ || status=$?
[ -s "$results" ] || not_gradable "scripts/grade exited $status without a result"
