"""Write a graded submission out for its readers: Gradescope's results.json,
JUnit XML and a human summary (write_all). Every output carries the replay
information (seeds, fabric profile, lock semantics, fabric parameters, first
failing seed) so that any failure can be re-run exactly.

results.json follows the Gradescope autograder specification
(gradescope-autograders.readthedocs.io/en/latest/specs/): top-level score,
execution_time, output, visibility, stdout_visibility, extra_data, tests[] with
name, score, max_score, status ("passed"/"failed"), output, visibility. The
specification has no top-level max_score; ours is in extra_data.mmiolab with
everything needed to read the result back (load_results_json), which is what
the gradebook's merge (gradebook.py) uses.

What is for the instructor alone stays out of everything a student may see
(summary.txt, results.json, a platform's file): the flags (code someone
should read; a student who saw them could edit until the list is empty), the
diff against the starter, and the time the hidden tests' guest took (a driver
could encode what it measured there in how long it sleeps). They go to
instructor.json (read back with results.json by load_results_json, so the
gradebook and its merge keep them), instructor.txt (every test, the flags and
the diff, in words) and junit.xml (the instructor's CI view).
"""

from __future__ import annotations

import json
import html
import math
import os
import xml.etree.ElementTree as ET
from dataclasses import asdict
from typing import Any

from .model import (MAX_OUTPUT, MAX_TEST_OUTPUT, RESULT_SCHEMA, WHY, GradeResult, Replay,
                     ReportError, TestOutcome, atomic_write, cap_text, clean_obj, clean_text,
                     shown_number)


# ---------------------------------------------------------------------------- Gradescope

def gradescope_json(result: GradeResult, visibility: str = "visible",
                    stdout_visibility: str = "hidden") -> dict[str, Any]:
    """The results.json document (Gradescope autograder specification)."""
    tests = []
    for i, t in enumerate(result.tests, 1):
        entry = {
            "name": t.name,
            "number": str(i),
            "score": t.score,
            "max_score": t.max_score,
            "status": "passed" if t.status == "passed" else "failed",
            "output": cap_text(clean_text(t.output), MAX_TEST_OUTPUT),
            "visibility": t.visibility,
            "extra_data": {"status": t.status},
        }
        if t.html:
            # Gradescope renders a test's output as HTML when asked to: the
            # text, escaped, then the picture of the failing run.
            entry["output"] = ("<pre>" + html.escape(cap_text(clean_text(t.output), MAX_TEST_OUTPUT))
                               + "</pre>" + t.html)
            entry["output_format"] = "html"
        tests.append(entry)
    return {
        "score": result.score,
        "execution_time": int(math.ceil(result.visible_seconds)),
        "output": cap_text(clean_text(summary_text(result)), MAX_OUTPUT),
        "output_format": "text",
        "test_output_format": "text",
        "visibility": visibility,
        "stdout_visibility": stdout_visibility,
        "extra_data": {"mmiolab": _extra(result)},
        "tests": tests,
    }


def _extra(result: GradeResult) -> dict[str, Any]:
    return {
        "schema": RESULT_SCHEMA,
        "submission_id": result.submission_id,
        "lab": result.lab,
        "submission": result.submission,
        "verdict": result.verdict,
        "max_score": result.max_score,
        "replay": asdict(result.replay),
        "replay_command": result.replay.command(result.lab, result.submission),
        "console_log": result.console_log,
        "execution_time": result.visible_seconds,
        "graded_at": result.graded_at,
        "host": result.host,
        "notes": result.notes,
        "confinement": result.confinement,
        "key": result.key,
        "descriptions": {t.name: t.description for t in result.tests},
    }


def write_results_json(result: GradeResult, path: str, **kw: Any) -> None:
    doc = clean_obj(gradescope_json(result, **kw))
    atomic_write(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def load_results_json(path: str) -> GradeResult:
    """Read back a results.json we wrote (for merge and --resume)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        extra = doc["extra_data"]["mmiolab"]
        if extra.get("schema") != RESULT_SCHEMA:
            raise ReportError(f"{path}: result schema {extra.get('schema')!r}")
        desc = extra.get("descriptions", {})
        tests = [TestOutcome(name=t["name"], score=float(t["score"]),
                             max_score=float(t["max_score"]),
                             status=t.get("extra_data", {}).get("status", t["status"]),
                             output=t.get("output", ""),
                             visibility=t.get("visibility", "visible"),
                             description=desc.get(t["name"], ""))
                 for t in doc["tests"]]
        rep = extra.get("replay", {})
        result = GradeResult(
            submission_id=extra["submission_id"], lab=extra["lab"], tests=tests,
            replay=Replay(**rep), execution_time=float(extra.get("execution_time", 0.0)),
            console_log=extra.get("console_log"), submission=extra.get("submission", ""),
            verdict=extra.get("verdict", "graded"), notes=list(extra.get("notes", [])),
            graded_at=extra.get("graded_at", ""), host=extra.get("host", ""),
            flags=list(extra.get("flags", [])), key=dict(extra.get("key", {})),
            diff=str(extra.get("diff", "")),
            confinement=str(extra.get("confinement", "")))
    except ReportError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReportError(f"{path}: not a mmiolab results.json ({type(e).__name__}: {e})") from e
    _load_instructor(result, os.path.join(os.path.dirname(path), INSTRUCTOR_JSON))
    return result


# ---------------------------------------------------------------------------- instructor

INSTRUCTOR_JSON = "instructor.json"
INSTRUCTOR_TXT = "instructor.txt"


def instructor_json(result: GradeResult) -> dict[str, Any]:
    """What results.json leaves out for the instructor: flags, diff, the whole time."""
    return {"schema": RESULT_SCHEMA, "submission_id": result.submission_id,
            "lab": result.lab, "graded_at": result.graded_at, "flags": result.flags, "diff": result.diff,
            "execution_time": result.execution_time,
            "hidden_seconds": result.hidden_seconds}


def _load_instructor(result: GradeResult, path: str) -> None:
    """instructor.json's fields into a result read from the results.json beside it
    (none there: a platform's file, or one written before it existed)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: unreadable ({e})") from e
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA or (
            doc.get("submission_id"), doc.get("lab"), doc.get("graded_at")) != (
            result.submission_id, result.lab, result.graded_at):
        raise ReportError(f"{path}: not the instructor's half of this results.json")
    try:
        result.flags = [str(f) for f in doc.get("flags", [])]
        result.diff = str(doc.get("diff", ""))
        result.execution_time = float(doc.get("execution_time", result.execution_time))
        result.hidden_seconds = float(doc.get("hidden_seconds", 0.0))
    except (TypeError, ValueError) as e:
        raise ReportError(f"{path}: {e}") from e


def instructor_text(result: GradeResult) -> str:
    """The instructor's report: every test, the flags and the timings (summary_text
    with student=False), then the diff against the starter."""
    text = summary_text(result, student=False)
    if result.diff:
        text += "\nThe submission against the starter:\n" + result.diff.rstrip("\n") + "\n"
    return text


def write_instructor(result: GradeResult, out_dir: str) -> dict[str, str]:
    paths = {"instructor": os.path.join(out_dir, INSTRUCTOR_JSON),
             "instructor_text": os.path.join(out_dir, INSTRUCTOR_TXT)}
    atomic_write(paths["instructor"], json.dumps(clean_obj(instructor_json(result)), indent=2,
                                                 ensure_ascii=False) + "\n")
    atomic_write(paths["instructor_text"], clean_text(instructor_text(result)))
    return paths


# ---------------------------------------------------------------------------- JUnit

def junit_xml(result: GradeResult) -> str:
    """JUnit XML that CI systems read: one testsuite per submission, one testcase per test."""
    n_fail = sum(1 for t in result.tests if t.status == "failed")
    n_err = sum(1 for t in result.tests if t.status in ("crashed", "error"))
    n_skip = sum(1 for t in result.tests if t.status == "skipped")
    suite_name = f"{result.lab}.{result.submission_id}"
    common = {"tests": str(len(result.tests)), "failures": str(n_fail), "errors": str(n_err),
              "skipped": str(n_skip), "time": f"{result.execution_time:.3f}"}
    root = ET.Element("testsuites", {"name": f"mmiolab.{result.lab}", **common})
    suite = ET.SubElement(root, "testsuite", {"name": clean_text(suite_name), **common,
                                              "timestamp": result.graded_at[:19],
                                              "hostname": clean_text(result.host)})
    props = ET.SubElement(suite, "properties")
    for k, v in _replay_props(result):
        ET.SubElement(props, "property", {"name": k, "value": clean_text(str(v))})
    for t in result.tests:
        case = ET.SubElement(suite, "testcase", {
            "classname": clean_text(f"mmiolab.{result.lab}.{result.submission_id}"),
            "name": t.name, "time": f"{t.seconds or 0.0:.3f}"})
        text = cap_text(clean_text(t.output), MAX_TEST_OUTPUT)
        msg = f"{t.name}: {shown_number(t.score)}/{shown_number(t.max_score)}: {WHY[t.status]}"
        if t.status == "failed" or (t.status == "passed" and t.score < t.max_score):
            ET.SubElement(case, "failure", {"message": msg, "type": t.status}).text = text
        elif t.status in ("crashed", "error"):
            ET.SubElement(case, "error", {"message": msg, "type": t.status}).text = text
        elif t.status == "skipped":
            ET.SubElement(case, "skipped", {"message": msg})
        ET.SubElement(case, "system-out").text = text
    ET.SubElement(suite, "system-out").text = cap_text(clean_text(summary_text(result, False)),
                                                   MAX_OUTPUT)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _replay_props(result: GradeResult) -> list[tuple[str, Any]]:
    r = result.replay
    props: list[tuple[str, Any]] = [
        ("submission", result.submission), ("verdict", result.verdict),
        ("score", shown_number(result.score)), ("max_score", shown_number(result.max_score)),
        ("seeds", ",".join(map(str, r.seeds))), ("profile", r.profile),
        ("semantics", r.semantics),
        ("first_failing_seed", "" if r.first_failing_seed is None else r.first_failing_seed),
        ("replay", r.command(result.lab, result.submission)),
        ("console_log", result.console_log or "")]
    props += [(f"fabric.{k}", v) for k, v in sorted(r.params.items())]
    return props


def write_junit(result: GradeResult, path: str) -> None:
    atomic_write(path, junit_xml(result))


# ---------------------------------------------------------------------------- summary

def summary_text(result: GradeResult, student: bool = True) -> str:
    """What a student or instructor reads: the score, what failed and why in plain
    words, how to replay it, and the part of the console log that matters.

    student (results.json's top-level output, summary.txt): tests that are not
    "visible" are left out, names, scores, outputs and all, and so are their
    points in the score shown; they are seen with their own visibility in
    results.json. The instructor's version (student=False, JUnit) has them all."""
    shown = [t for t in result.tests if not student or t.visibility == "visible"]
    held = [t for t in result.tests if t not in shown]
    width = max([len(t.name) for t in shown] + [4])
    score, most = sum(t.score for t in shown), sum(t.max_score for t in shown)
    out = [f"mmiolab {result.lab}: {result.submission_id}: {shown_number(score)}/{shown_number(most)}"
           + (f" (visible tests; {len(held)} more tests, {shown_number(sum(t.max_score for t in held))}"
              f" points, are shown when grades are published)" if held else ""),
           f"graded {result.graded_at} on {result.host} in "
           + (f"{result.visible_seconds:.1f}s" + (" (not counting the hidden tests)"
                                                   if result.hidden_seconds else "")
              if student else f"{result.execution_time:.1f}s"
              + (f" (the hidden tests' guest {result.hidden_seconds:.1f}s)"
                 if result.hidden_seconds else ""))]
    if student:                     # what the held tests re-check (lab.toml's notice)
        out += [f"note: {t.notice}" for t in held if t.notice]
    if result.submission:
        out.append(f"submission: {result.submission}")
    if result.verdict != "graded":
        out.append(f"not graded in the guest: {result.verdict}")
    out += [f"note: {n}" for n in result.notes]
    if not student:                 # flags are for the instructor's eyes only
        out += [f"flagged for the instructor: {f}" for f in result.flags]
    if result.confinement:
        out.append(f"build confinement: {result.confinement}")
    out.append("")
    for t in shown:
        word = t.status if t.status == "passed" else t.status.upper()
        out.append(f"  {word:8} {t.name:{width}}  {shown_number(t.score):>5}/{shown_number(t.max_score)}")
    failed = [t for t in result.failed if t in shown]
    if failed:
        out += ["", "What failed and why:"]
        for t in failed:
            why = WHY[t.status] if t.status != "passed" else "passed, with part of the points"
            out.append(f"- {t.name} ({shown_number(t.score)}/{shown_number(t.max_score)}): {why}.")
            if t.description:
                out.append(f"  The test: {t.description}")
            lines = [l for l in t.output.splitlines() if l.strip() and l != t.description]
            for line in lines[:25]:
                out.append(f"    {line}")
            if len(lines) > 25:
                out.append(f"    [... {len(lines) - 25} more lines]")
    out += ["", "Replay:", f"  {result.replay.describe()}",
            f"  {result.replay.command(result.lab, result.submission)}"]
    if result.console_log:
        out += ["", f"Console log: {result.console_log}"]
    if result.console_excerpt:
        out += ["", result.console_excerpt.rstrip()]
    return "\n".join(out) + "\n"


def write_summary(result: GradeResult, path: str) -> None:
    atomic_write(path, clean_text(summary_text(result)))


def write_all(result: GradeResult, out_dir: str, **kw: Any) -> dict[str, str]:
    """results.json, junit.xml, summary.txt and the instructor's files
    (write_instructor) of one submission, each atomic.

    results.json is written last: its presence means the submission is done (--resume).
    """
    paths = {"junit": os.path.join(out_dir, "junit.xml"),
             "summary": os.path.join(out_dir, "summary.txt"),
             "results": os.path.join(out_dir, "results.json")}
    write_junit(result, paths["junit"])
    paths.update(write_instructor(result, out_dir))
    write_summary(result, paths["summary"])
    write_results_json(result, paths["results"], **kw)
    return paths
