"""Gradescope: where its grading container puts a submission, and the
results.json it reads back (the zip an instructor uploads is packed by
pack.py, an instructor's tool).

Gradescope unpacks the autograder zip into /autograder/source of a fresh
image, runs setup.sh there once as root, copies run_autograder to /autograder,
and then, for each submission, puts the student's files in
/autograder/submission, runs /autograder/run_autograder and reads
/autograder/results/results.json (gradescope-autograders.readthedocs.io/en/
latest/specs/). The kit's own record of a grade (report.gradescope_json) is
that document already; here it is written where Gradescope reads it, and
checked against the specification's fields and words.
"""

from __future__ import annotations

import os
from typing import Any

from ...model import NOT_CHARGED, GradeResult
from ...report import write_results_json
from ..base import Container, Platform


# The fields and words of Gradescope's results.json specification
# (gradescope-autograders.readthedocs.io/en/latest/specs/, "Output format").
GS_TOP = {"score", "execution_time", "output", "output_format", "test_output_format",
          "test_name_format", "visibility", "stdout_visibility", "extra_data", "tests",
          "leaderboard"}
GS_TEST = {"score", "max_score", "status", "name", "name_format", "number", "output",
           "output_format", "tags", "visibility", "extra_data"}
GS_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
GS_FORMATS = {"text", "html", "simple_format", "md", "ansi"}


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def problems(doc: Any) -> list[str]:
    """What in a results.json document Gradescope's specification does not allow
    (empty when none), and whether its total is its tests' sum."""
    bad: list[str] = []
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    bad += [f"unknown field {k!r}" for k in sorted(set(doc) - GS_TOP)]
    if not _number(doc.get("score")):
        bad.append("no numeric score")
    for key in ("visibility", "stdout_visibility"):
        if key in doc and doc[key] not in GS_VISIBILITY:
            bad.append(f"{key} {doc[key]!r}")
    for key in ("output_format", "test_output_format", "test_name_format"):
        if key in doc and doc[key] not in GS_FORMATS:
            bad.append(f"{key} {doc[key]!r}")
    tests = doc.get("tests", [])
    if not isinstance(tests, list):
        return bad + ["tests is not a list"]
    for i, t in enumerate(tests):
        name = t.get("name", f"test {i}") if isinstance(t, dict) else f"test {i}"
        if not isinstance(t, dict):
            bad.append(f"{name}: not an object")
            continue
        bad += [f"{name}: unknown field {k!r}" for k in sorted(set(t) - GS_TEST)]
        if not (_number(t.get("score")) and _number(t.get("max_score"))):
            bad.append(f"{name}: score and max_score must be numbers")
        elif not 0 <= t["score"] <= t["max_score"]:
            bad.append(f"{name}: score {t['score']} outside 0..{t['max_score']}")
        if t.get("status", "passed") not in ("passed", "failed"):
            bad.append(f"{name}: status {t['status']!r}")
        if t.get("visibility", "visible") not in GS_VISIBILITY:
            bad.append(f"{name}: visibility {t['visibility']!r}")
        if t.get("output_format", "text") not in GS_FORMATS:
            bad.append(f"{name}: output_format {t['output_format']!r}")
        if not isinstance(t.get("output", ""), str):
            bad.append(f"{name}: output is not text")
    if _number(doc.get("score")) and tests and all(isinstance(t, dict) and _number(t.get("score"))
                                               for t in tests):
        total = sum(t["score"] for t in tests)
        if abs(total - doc["score"]) > 1e-6:
            bad.append(f"score {doc['score']} is not the tests' sum {total}")
    return bad


def write_results(result: GradeResult, path: str) -> bool:
    """results.json where Gradescope reads it (its folder made if need be);
    whether it was written. A result not counted (model.NOT_CHARGED: the
    grading machine's fault) writes none: Gradescope then tells the student
    that the autograder failed, not a score of theirs, and shows the
    instructor this output."""
    if result.verdict in NOT_CHARGED:
        print(f"mmiolab: {result.notes[0] if result.notes else result.verdict}", flush=True)
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_results_json(result, path)
    return True


PLATFORM = Platform(
    name="gradescope", title="Gradescope", root_setting="autograder",
    student="submission", results="results/results.json",
    write_results=write_results, problems=problems,
    package=__name__, packs="a lab's Gradescope autograder zip",
    # Gradescope's troubleshooting page: half a CPU, 768 MB, 10 minutes by
    # default. Gradescope builds the image on its own machines, so the build
    # gets the same limits.
    container=Container(cpus=0.5, memory="768m", timeout=600, build_limited=True))
