"""PrairieLearn: where its grading container puts a submission, and the
results.json the kit writes there (its question folder and grader image are
packed by pack.py, an instructor's tool).

PrairieLearn's contract, as its own sources state it (github.com/PrairieLearn/
PrairieLearn; docs/externalGrading.md unless said otherwise):

- A question's info.json enables external grading with "gradingMethod":
  "External" and an "externalGradingOptions" object: enabled, image (pullable
  by `docker pull`), entrypoint (an absolute path, executable in the image, or
  a file under /grade), serverFilesCourse (course files copied to
  /grade/serverFilesCourse), timeout (seconds, default 30, at most 600),
  enableNetworking (default off), environment. (The example question
  exampleCourse/questions/demo/autograder/codeUpload/info.json.)
- Each job gets a fresh container with /grade bound in: /grade/student (the
  submitted files), /grade/tests (the question's tests/ folder),
  /grade/serverFilesCourse, /grade/data/data.json; the entrypoint must create
  /grade/results and write /grade/results/results.json.
- results.json: "score" in [0, 1] (required when gradable); "gradable": false
  marks the submission "invalid, not gradable": no points awarded or lost, no
  attempt used; "message", "output", "images" ({label, url} data URLs) and
  "tests": [{name, description, points, max_points, message, output, images}],
  which <pl-external-grader-results> renders (apps/prairielearn/elements/
  pl-external-grader-results/pl-external-grader-results.py). No field says
  whether a student may see a test: whatever is in the file is shown.
- The file must stay under 1 MB: apps/grader-host/src/index.ts refuses a
  larger one, and it reads results.json only when the container exited 0 and
  within the timeout. apps/prairielearn/src/lib/externalGrader.ts makes a
  missing, non-finite or out-of-range score "not gradable".
- Grading containers run with 2 GiB of memory and no swap, 0.9 of a CPU
  (CpuQuota 90000 of CpuPeriod 100000), 1024 processes and a 1 GiB disk
  quota by default (apps/grader-host/src/lib/config.ts), without extra
  capabilities or devices (index.ts's createContainer): no /dev/kvm.
- Custom images must be public, on Docker Hub, ghcr.io, quay.io, GitLab's
  or Amazon's public registry, built for linux/amd64, and synced from the
  course's Sync page (docs/dockerImages.md).

So, differently from the Gradescope zip (platforms/gradescope/pack.py), which
is private:

- the grader image carries the kit files a student handout carries (it is
  public: anyone may pull it), never the lab's hidden tests;
- the hidden tests' programs travel in the question's tests/hidden/ folder,
  in the course repository that students cannot read; the entrypoint puts
  them back into the kit's lab folder before grading, and refuses to grade
  (not gradable) without them, rather than grade out of fewer points;
- tests that are not "visible" are reported as one aggregate row, its
  points and a fixed message, never their names, output or messages
  (Documentation/instructor/threat-model.rst, "Hidden tests stay hidden").
"""

from __future__ import annotations

import base64
import json
from typing import Any

from ...model import (NOT_CHARGED, TOO_SLOW, WHY, GradeResult, atomic_write, cap_text, clean_obj,
                      clean_text, shown_number)
from ...report import summary_text
from ..base import Container, Platform

# grader-host refuses results.json over 1 MiB; leave room for what it adds.
MAX_RESULTS_BYTES = 900 << 10
MAX_TEST_OUTPUT = 16 << 10
MAX_OUTPUT = 64 << 10
MAX_MESSAGE = 2 << 10
MAX_IMAGE_BYTES = 256 << 10
HIDDEN_MESSAGE = "hidden test: output held back"
HIDDEN_NAME = "hidden tests"


def _svg_image(html_text: str) -> list[dict[str, str]]:
    """The failing run's picture (the self-contained <svg> of a test's html: its
    caption is in the output already) as PrairieLearn's images entry, if small."""
    start, end = html_text.find("<svg"), html_text.rfind("</svg>")
    if start < 0 or end < start:
        return []
    data = html_text[start:end + len("</svg>")].encode("utf-8", "replace")
    if len(data) > MAX_IMAGE_BYTES:
        return []
    return [{"label": "the failing run",
             "url": "data:image/svg+xml;base64," + base64.b64encode(data).decode()}]


def results_json(result: GradeResult) -> dict[str, Any]:
    """The results.json document of `result` for PrairieLearn.

    score is the fraction of the lab's points (hidden tests' included, as in
    Gradescope's total). Only a grader failure is "not gradable"; a submission
    that did not build or was refused is graded 0 with the reason, as the
    other outputs grade it. Tests that are not "visible" are one row: their
    points and HIDDEN_MESSAGE, nothing they printed.
    """
    shown = [t for t in result.tests if t.visibility == "visible"]
    held = [t for t in result.tests if t.visibility != "visible"]
    most = result.max_score
    score = min(1.0, max(0.0, result.score / most)) if most > 0 else 0.0
    tests: list[dict[str, Any]] = []
    for t in shown:
        if t.status != "passed":
            said = f"{t.status}: {WHY[t.status]}"
        else:
            said = "passed" if t.score >= t.max_score else "passed, with part of the points"
        entry = {"name": t.name, "description": cap_text(clean_text(t.description), MAX_MESSAGE),
                 "points": t.score, "max_points": t.max_score,
                 "message": said, "output": cap_text(clean_text(t.output), MAX_TEST_OUTPUT)}
        if t.html:
            entry["images"] = _svg_image(t.html)
        tests.append(entry)
    if held:
        tests.append({"name": f"{HIDDEN_NAME} ({len(held)})",
                      "description": "tests the handout does not have",
                      "points": sum(t.score for t in held),
                      "max_points": sum(t.max_score for t in held),
                      "message": HIDDEN_MESSAGE, "output": ""})
    gradable = result.verdict not in NOT_CHARGED
    if gradable:
        message = (f"mmiolab {result.lab}: {shown_number(result.score)}/{shown_number(most)}"
                   + ("" if result.verdict == "graded" else
                      f" (not graded in the guest: {result.verdict})"))
    elif result.verdict == TOO_SLOW:
        message = ("The grading machine was too slow to finish the tests (they were still "
                   "making progress when its time ran out), not your code: it is not "
                   "counted. Submit again later, or tell the course staff.")
    else:
        message = ("The grader failed on this submission, not your code: it is not "
                   "counted. Submit again later, or tell the course staff.")
    doc: dict[str, Any] = {
        "gradable": gradable,
        "score": score if gradable else 0.0,
        "message": message,
        "output": cap_text(clean_text(_summary(result)), MAX_OUTPUT),
        "tests": tests,
    }
    return _fit(clean_obj(doc))


# summary_text's words for Gradescope, whose hidden tests appear when grades are published;
# here they never appear one by one.
_GS_HELD = "are shown when grades are published"
_PL_HELD = f"are in the row \"{HIDDEN_NAME}\" below, without their output"


def _summary(result: GradeResult) -> str:
    """The student's summary (report.summary_text: visible tests only, and how many
    points the others hold), in PrairieLearn's words."""
    return summary_text(result).replace(_GS_HELD, _PL_HELD, 1)


def _fit(doc: dict[str, Any]) -> dict[str, Any]:
    """Keep the document under MAX_RESULTS_BYTES: pictures go first, then output."""
    def size() -> int:
        return len(json.dumps(doc, ensure_ascii=False).encode())
    if size() > MAX_RESULTS_BYTES:
        for t in doc["tests"]:
            t.pop("images", None)
    limit = MAX_TEST_OUTPUT
    while size() > MAX_RESULTS_BYTES and limit > 256:
        limit //= 4
        doc["output"] = cap_text(clean_text(doc["output"]), limit * 4)
        for t in doc["tests"]:
            t["output"] = cap_text(clean_text(t["output"]), limit)
    return doc


def write_results(result: GradeResult, path: str) -> bool:
    """results.json where PrairieLearn reads it, always (a result not counted
    is "not gradable" there: results_json)."""
    atomic_write(path, json.dumps(results_json(result), indent=2, ensure_ascii=False) + "\n")
    return True


def problems(doc: Any) -> list[str]:
    """What in a results.json document PrairieLearn would not take as a grade
    (empty when none): apps/prairielearn/src/lib/externalGrader.ts makes a
    missing, non-finite or out-of-range score "not gradable", and grader-host
    refuses a file over 1 MB."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    bad = []
    score = doc.get("score")
    if doc.get("gradable", True) is not False and not (
            isinstance(score, (int, float)) and not isinstance(score, bool)
            and 0.0 <= score <= 1.0):
        bad.append(f"score {score!r} is not a number in [0, 1]")
    if len(json.dumps(doc, ensure_ascii=False).encode()) > MAX_RESULTS_BYTES:
        bad.append(f"over {MAX_RESULTS_BYTES} bytes")
    tests = doc.get("tests", [])
    if not isinstance(tests, list):
        bad.append("tests is not a list")
    return bad


PLATFORM = Platform(
    name="prairielearn", title="PrairieLearn", root_setting="prairielearn",
    student="student", results="results/results.json",
    write_results=write_results, problems=problems,
    package=__name__, packs="a lab's PrairieLearn question and grader image",
    # grader-host's defaults (apps/grader-host/src/lib/config.ts, above): 0.9
    # of a CPU, 2 GiB and no swap, 1024 processes; a job's time "cannot exceed
    # 600 seconds" (docs/externalGrading.md), the question's timeout (pack.py).
    # The instructor builds the image: no limits there.
    container=Container(cpus=0.9, memory="2g", timeout=600, swap="2g", pids=1024))
