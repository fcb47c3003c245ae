"""Write a graded submission out: Gradescope results.json, JUnit XML, a human
summary, and rows of a class gradebook (CSV) that shards can merge. The result
model (GradeResult, TestOutcome, Replay) is here too; how a run becomes points
is the score stage's (stages.py), and when each output is written the write
stage's.

Every output carries the replay information (seeds, fabric profile, lock
semantics, fabric parameters, first failing seed) so that any failure can be
re-run exactly. Every file is written atomically (a temporary file in the same
folder, then os.replace), so a killed batch leaves either the old file or the
new one, never half of one, and ``--resume`` can trust what it finds.

results.json follows the Gradescope autograder specification
(gradescope-autograders.readthedocs.io/en/latest/specs/): top-level score,
execution_time, output, visibility, stdout_visibility, extra_data, tests[] with
name, score, max_score, status ("passed"/"failed"), output, visibility. The
specification has no top-level max_score; ours is in extra_data.mmiolab with
everything needed to read the result back (load_results_json), which is what
``merge`` uses to build one gradebook from several hosts' outputs:

    PYTHONPATH=scripts python3 -m mmiolab merge -o gradebook.csv OUT_DIR...
"""

from __future__ import annotations

import argparse
import csv
import datetime
import fcntl
import io
import json
import html
import math
import os
import re
import socket
import sys
import tempfile
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from . import MmiolabError

STATUSES = ("passed", "failed", "crashed", "error", "skipped")
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
RESULT_SCHEMA = 1
MAX_TEST_OUTPUT = 32 << 10
MAX_OUTPUT = 64 << 10

FIXED_COLUMNS = ["student", "lab", "score", "max_score", "verdict"]
TAIL_COLUMNS = ["failed_tests", "flags", "first_failing_seed", "seeds_passed", "seeds", "profile",
                "semantics", "params", "execution_time", "graded_at", "host", "kit",
                "submission", "console_log", "results"]
TEST_PREFIX = "test:"

_WHY = {
    "passed": "passed",
    "failed": "the test ran and did not pass",
    "crashed": ("the test never reported a result: the guest crashed, hung or was stopped "
                "before it finished (see the console excerpt)"),
    "error": "the test could not run",
    "skipped": "the test was skipped",
}


class ReportError(MmiolabError):
    """A result that cannot be written or read back (bad fields, unreadable file)."""


@dataclass
class TestOutcome:
    """The graded outcome of one test of a lab."""
    name: str
    score: float
    max_score: float
    status: str                     # passed | failed | crashed | error | skipped
    output: str = ""
    visibility: str = "visible"
    description: str = ""
    seconds: float | None = None
    html: str = ""                  # a picture of the failing run (an inline SVG), if any

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ReportError(f"test {self.name}: status {self.status!r} not in {STATUSES}")
        if self.visibility not in VISIBILITIES:
            raise ReportError(f"test {self.name}: visibility {self.visibility!r}")
        if not 0 <= self.score <= self.max_score:
            raise ReportError(f"test {self.name}: score {self.score} outside 0..{self.max_score}")


@dataclass
class Replay:
    """What it takes to run a grading again and see the same failure."""
    seeds: list[int] = field(default_factory=list)
    profile: str = ""
    semantics: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    first_failing_seed: int | None = None
    seeds_passed: int | None = None       # of len(seeds), for the race tests

    def command(self, lab: str, submission: str) -> str:
        seed = self.first_failing_seed if self.first_failing_seed is not None else (
            self.seeds[0] if self.seeds else None)
        opt = f" --seed {seed}" if seed is not None else ""
        return f"scripts/grade --lab {lab}{opt} {_shell_quote(submission or 'SUBMISSION')}"

    def describe(self) -> str:
        parts = [f"seeds {','.join(map(str, self.seeds)) or '-'}"]
        if self.seeds_passed is not None and self.seeds:
            parts.append(f"{self.seeds_passed}/{len(self.seeds)} seeds passed")
        if self.first_failing_seed is not None:
            parts.append(f"first failing seed {self.first_failing_seed}")
        fabric = [f"profile {self.profile or '?'}", f"semantics {self.semantics or '?'}"]
        fabric += [f"{k}={v}" for k, v in sorted(self.params.items())]
        return "; ".join(parts) + "; fabric: " + ", ".join(fabric)


@dataclass
class GradeResult:
    """Everything the outputs need about one graded submission."""
    submission_id: str
    lab: str
    tests: list[TestOutcome]
    replay: Replay = field(default_factory=Replay)
    execution_time: float = 0.0
    console_log: str | None = None
    submission: str = ""                 # its name as handed in (never a host path)
    verdict: str = "graded"              # graded, or why it was not (an intake verdict...)
    notes: list[str] = field(default_factory=list)   # intake and build remarks, plain words
    console_excerpt: str = ""
    # For the instructor's attention (an unconfined build, inline assembly...): the
    # grade stands, but someone should read the code.
    flags: list[str] = field(default_factory=list)
    # What the grade depends on (lab, seeds, cmds, fabric, kit, submission digest):
    # --resume re-grades when any of it differs.
    key: dict[str, Any] = field(default_factory=dict)
    # The submission against the lab's starter (unified diff), for the instructor.
    diff: str = ""
    graded_at: str = field(default_factory=lambda: _now())
    host: str = field(default_factory=socket.gethostname)

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    @property
    def failed(self) -> list[TestOutcome]:
        return [t for t in self.tests if t.status != "passed" or t.score < t.max_score]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _shell_quote(s: str) -> str:
    return s if re.fullmatch(r"[A-Za-z0-9_./:@%+=,-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0")


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


# ---------------------------------------------------------------------------- atomic files

def atomic_write(path: str, data: str | bytes, mode: int = 0o644) -> None:
    """Write a whole file or nothing: temp file in the same folder, fsync, os.replace."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
            "output": _cap(_clean_text(t.output), MAX_TEST_OUTPUT),
            "visibility": t.visibility,
            "extra_data": {"status": t.status},
        }
        if t.html:
            # Gradescope renders a test's output as HTML when asked to: the
            # text, escaped, then the picture of the failing run.
            entry["output"] = ("<pre>" + html.escape(entry["output"]) + "</pre>"
                               + t.html)
            entry["output_format"] = "html"
        tests.append(entry)
    return {
        "score": result.score,
        "execution_time": int(math.ceil(result.execution_time)),
        "output": _cap(_clean_text(summary_text(result)), MAX_OUTPUT),
        "output_format": "text",
        "test_output_format": "text",
        "visibility": visibility,
        "stdout_visibility": stdout_visibility,
        "extra_data": {"mmiolab": _extra(result)},
        "tests": tests,
    }


# The fields and words of Gradescope's results.json specification
# (gradescope-autograders.readthedocs.io/en/latest/specs/, "Output format").
GS_TOP = {"score", "execution_time", "output", "output_format", "test_output_format",
          "test_name_format", "visibility", "stdout_visibility", "extra_data", "tests",
          "leaderboard"}
GS_TEST = {"score", "max_score", "status", "name", "name_format", "number", "output",
           "output_format", "tags", "visibility", "extra_data"}
GS_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
GS_FORMATS = {"text", "html", "simple_format", "md", "ansi"}


def gradescope_problems(doc: Any) -> list[str]:
    """What in a results.json document Gradescope's specification does not allow
    (empty when none), and whether its total is its tests' sum."""
    bad = []
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    bad += [f"unknown field {k!r}" for k in sorted(set(doc) - GS_TOP)]
    num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    if not num(doc.get("score")):
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
        if not (num(t.get("score")) and num(t.get("max_score"))):
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
    if num(doc.get("score")) and tests and all(isinstance(t, dict) and num(t.get("score"))
                                               for t in tests):
        total = sum(t["score"] for t in tests)
        if abs(total - doc["score"]) > 1e-6:
            bad.append(f"score {doc['score']} is not the tests' sum {total}")
    return bad


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
        "execution_time": result.execution_time,
        "graded_at": result.graded_at,
        "host": result.host,
        "notes": result.notes,
        "flags": result.flags,
        "diff": result.diff,
        "key": result.key,
        "descriptions": {t.name: t.description for t in result.tests},
    }


def _clean_obj(obj: Any) -> Any:
    """Every string of a JSON document made valid UTF-8 (paths may carry undecodable bytes)."""
    if isinstance(obj, str):
        return obj.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(obj, dict):
        return {_clean_obj(k): _clean_obj(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean_obj(v) for v in obj]
    return obj


def write_results_json(result: GradeResult, path: str, **kw: Any) -> None:
    doc = _clean_obj(gradescope_json(result, **kw))
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
        return GradeResult(
            submission_id=extra["submission_id"], lab=extra["lab"], tests=tests,
            replay=Replay(**rep), execution_time=float(extra.get("execution_time", 0.0)),
            console_log=extra.get("console_log"), submission=extra.get("submission", ""),
            verdict=extra.get("verdict", "graded"), notes=list(extra.get("notes", [])),
            graded_at=extra.get("graded_at", ""), host=extra.get("host", ""),
            flags=list(extra.get("flags", [])), key=dict(extra.get("key", {})),
            diff=str(extra.get("diff", "")))
    except ReportError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReportError(f"{path}: not a mmiolab results.json ({type(e).__name__}: {e})") from e


# ---------------------------------------------------------------------------- JUnit

_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean_text(text: str) -> str:
    """Text safe for XML 1.0 and JSON consumers: no control characters, no lone surrogates."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return _XML_BAD.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def junit_xml(result: GradeResult) -> str:
    """JUnit XML that CI systems read: one testsuite per submission, one testcase per test."""
    n_fail = sum(1 for t in result.tests if t.status == "failed")
    n_err = sum(1 for t in result.tests if t.status in ("crashed", "error"))
    n_skip = sum(1 for t in result.tests if t.status == "skipped")
    suite_name = f"{result.lab}.{result.submission_id}"
    common = {"tests": str(len(result.tests)), "failures": str(n_fail), "errors": str(n_err),
              "skipped": str(n_skip), "time": f"{result.execution_time:.3f}"}
    root = ET.Element("testsuites", {"name": f"mmiolab.{result.lab}", **common})
    suite = ET.SubElement(root, "testsuite", {"name": _clean_text(suite_name), **common,
                                              "timestamp": result.graded_at[:19],
                                              "hostname": _clean_text(result.host)})
    props = ET.SubElement(suite, "properties")
    for k, v in _replay_props(result):
        ET.SubElement(props, "property", {"name": k, "value": _clean_text(str(v))})
    for t in result.tests:
        case = ET.SubElement(suite, "testcase", {
            "classname": _clean_text(f"mmiolab.{result.lab}.{result.submission_id}"),
            "name": t.name, "time": f"{t.seconds or 0.0:.3f}"})
        text = _cap(_clean_text(t.output), MAX_TEST_OUTPUT)
        msg = f"{t.name}: {_num(t.score)}/{_num(t.max_score)}: {_WHY[t.status]}"
        if t.status == "failed" or (t.status == "passed" and t.score < t.max_score):
            ET.SubElement(case, "failure", {"message": msg, "type": t.status}).text = text
        elif t.status in ("crashed", "error"):
            ET.SubElement(case, "error", {"message": msg, "type": t.status}).text = text
        elif t.status == "skipped":
            ET.SubElement(case, "skipped", {"message": msg})
        ET.SubElement(case, "system-out").text = text
    ET.SubElement(suite, "system-out").text = _cap(_clean_text(summary_text(result, False)),
                                                   MAX_OUTPUT)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _replay_props(result: GradeResult) -> list[tuple[str, Any]]:
    r = result.replay
    props: list[tuple[str, Any]] = [
        ("submission", result.submission), ("verdict", result.verdict),
        ("score", _num(result.score)), ("max_score", _num(result.max_score)),
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
    out = [f"mmiolab {result.lab}: {result.submission_id}: {_num(score)}/{_num(most)}"
           + (f" (visible tests; {len(held)} more tests, {_num(sum(t.max_score for t in held))}"
              f" points, are shown when grades are published)" if held else ""),
           f"graded {result.graded_at} on {result.host} in {result.execution_time:.1f}s"]
    if result.submission:
        out.append(f"submission: {result.submission}")
    if result.verdict != "graded":
        out.append(f"not graded in the guest: {result.verdict}")
    out += [f"note: {n}" for n in result.notes]
    out += [f"flagged for the instructor: {f}" for f in result.flags]
    out.append("")
    for t in shown:
        word = t.status if t.status == "passed" else t.status.upper()
        out.append(f"  {word:8} {t.name:{width}}  {_num(t.score):>5}/{_num(t.max_score)}")
    failed = [t for t in result.failed if t in shown]
    if failed:
        out += ["", "What failed and why:"]
        for t in failed:
            why = _WHY[t.status] if t.status != "passed" else "passed, with part of the points"
            out.append(f"- {t.name} ({_num(t.score)}/{_num(t.max_score)}): {why}.")
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
    atomic_write(path, _clean_text(summary_text(result)))


def write_all(result: GradeResult, out_dir: str, **kw: Any) -> dict[str, str]:
    """results.json, junit.xml and summary.txt of one submission, each atomic.

    results.json is written last: its presence means the submission is done (--resume).
    """
    paths = {"junit": os.path.join(out_dir, "junit.xml"),
             "summary": os.path.join(out_dir, "summary.txt"),
             "results": os.path.join(out_dir, "results.json")}
    write_junit(result, paths["junit"])
    write_summary(result, paths["summary"])
    write_results_json(result, paths["results"], **kw)
    return paths


# ---------------------------------------------------------------------------- gradebook

_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(text: str) -> str:
    """Keep spreadsheets from running a student-chosen id as a formula."""
    text = _clean_text(text).replace("\n", " ")
    return "'" + text if text.startswith(_FORMULA) else text


def _uncell(text: str) -> str:
    return text[1:] if len(text) > 1 and text[0] == "'" and text[1] in _FORMULA else text


def gradebook_row(result: GradeResult, results_path: str = "",
                  source: str = "") -> dict[str, str]:
    """One CSV row per student: scores per test and the replay information. The
    gradebook is the instructor's: it may name host paths (`source`, the path
    graded; the console log next to `results_path`)."""
    r = result.replay
    console = result.console_log or ""
    if console and results_path and not os.path.isabs(console):
        console = os.path.join(os.path.dirname(os.path.abspath(results_path)), console)
    row = {
        "student": _cell(result.submission_id), "lab": _cell(result.lab),
        "score": _num(result.score), "max_score": _num(result.max_score),
        "verdict": _cell(result.verdict),
        "failed_tests": _cell(" ".join(f"{t.name}({t.status})" for t in result.failed)),
        "first_failing_seed": "" if r.first_failing_seed is None else str(r.first_failing_seed),
        "seeds_passed": "" if r.seeds_passed is None else f"{r.seeds_passed}/{len(r.seeds)}",
        "seeds": " ".join(map(str, r.seeds)), "profile": _cell(r.profile),
        "semantics": _cell(r.semantics),
        "params": _cell(" ".join(f"{k}={v}" for k, v in sorted(r.params.items()))),
        "execution_time": f"{result.execution_time:.1f}", "graded_at": result.graded_at,
        "host": _cell(result.host), "console_log": _cell(console),
        "results": _cell(results_path), "flags": _cell("; ".join(result.flags)),
        "kit": _cell(str(result.key.get("kit", ""))), "submission": _cell(source),
    }
    for t in result.tests:
        row[TEST_PREFIX + t.name] = _num(t.score)
    return row


@dataclass
class MergeReport:
    """What a gradebook merge did, for the terminal."""
    path: str
    rows: int = 0
    added: int = 0
    replaced: int = 0
    kept: int = 0
    problems: list[str] = field(default_factory=list)


@contextmanager
def _locked(path: str) -> Iterator[None]:
    """One writer at a time per gradebook on this host (parallel graders append)."""
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_gradebook(path: str) -> tuple[list[str], list[dict[str, str]]]:
    """(columns, rows) of a gradebook CSV; ([], []) if it does not exist."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = [dict(r) for r in reader]
            return list(reader.fieldnames or []), rows
    except FileNotFoundError:
        return [], []
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ReportError(f"{path}: unreadable gradebook ({e})") from e


def _key(row: dict[str, str]) -> tuple[str, str]:
    return (_uncell(row.get("lab", "")), _uncell(row.get("student", "")))


def _merge_rows(columns: list[str], base: list[dict[str, str]],
                incoming: Iterable[dict[str, str]], report: MergeReport) -> tuple[list[str],
                                                                                 list[dict]]:
    rows = {_key(r): r for r in base}
    tests = [c for c in columns if c.startswith(TEST_PREFIX)]
    for row in incoming:
        for c in row:
            if c.startswith(TEST_PREFIX) and c not in tests:
                tests.append(c)
        k = _key(row)
        old = rows.get(k)
        if old is None:
            rows[k] = row
            report.added += 1
        elif row.get("graded_at", "") >= old.get("graded_at", ""):
            rows[k] = row
            report.replaced += 1
        else:
            report.kept += 1
            report.problems.append(f"{k[1]} ({k[0]}): kept the newer grading from "
                                   f"{old.get('graded_at')}, not {row.get('graded_at')}")
    cols = FIXED_COLUMNS + tests + TAIL_COLUMNS
    cols += [c for c in columns if c not in cols]
    ordered = [rows[k] for k in sorted(rows)]
    report.rows = len(ordered)
    return cols, ordered


def _write_gradebook(path: str, columns: list[str], rows: list[dict[str, str]]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, restval="", extrasaction="ignore",
                       lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(path, buf.getvalue())


def update_gradebook(path: str, results: Iterable[GradeResult | tuple]) -> MergeReport:
    """Add or replace rows (one per student and lab), keeping the newest grading;
    items are results or (result, results.json path[, submission path]) tuples.

    Safe against concurrent writers on one host (a lock file) and against a kill
    (atomic replace); shards from other hosts merge with merge().
    """
    report = MergeReport(path)
    rows = []
    for item in results:
        res, *rest = item if isinstance(item, tuple) else (item,)
        rows.append(gradebook_row(res, *rest))
    with _locked(path):
        columns, base = read_gradebook(path)
        cols, merged = _merge_rows(columns, base, rows, report)
        _write_gradebook(path, cols, merged)
    return report


def _inputs(paths: Sequence[str], report: MergeReport) -> Iterator[dict[str, str]]:
    for p in paths:
        if os.path.isdir(p):
            for folder, dirs, files in os.walk(p):
                dirs.sort()
                if "results.json" in files:       # folders: per-submission results only
                    yield from _inputs([os.path.join(folder, "results.json")], report)
        elif p.endswith(".csv"):
            try:
                _, rows = read_gradebook(p)
            except ReportError as e:
                report.problems.append(str(e))
                continue
            if rows and ("student" not in rows[0] or "lab" not in rows[0]):
                report.problems.append(f"{p}: not a gradebook (no student/lab columns)")
                continue
            yield from rows
        else:
            try:
                yield gradebook_row(load_results_json(p), os.path.abspath(p))
            except ReportError as e:
                report.problems.append(str(e))


def merge(inputs: Sequence[str], out: str) -> MergeReport:
    """Merge results.json files, folders searched for results.json, and gradebook CSV
    shards (named explicitly) into one gradebook (out is merged into, not overwritten). Unreadable inputs are listed
    in the report's problems; they never abort the merge."""
    report = MergeReport(out)
    with _locked(out):
        columns, base = read_gradebook(out)
        cols, merged = _merge_rows(columns, base, list(_inputs(inputs, report)), report)
        _write_gradebook(out, cols, merged)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m mmiolab.report",
                                 description="mmiolab grade reports")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="merge results.json files, result folders and gradebook "
                                     "CSV shards into one gradebook")
    m.add_argument("-o", "--out", default="gradebook.csv", help="gradebook to merge into")
    m.add_argument("inputs", nargs="+", help="results.json, folders, or gradebook .csv files")
    args = ap.parse_args(argv)
    rep = merge(args.inputs, args.out)
    for p in rep.problems:
        print(f"mmiolab: merge: {p}", file=sys.stderr)
    print(f"mmiolab: {rep.path}: {rep.rows} students ({rep.added} added, {rep.replaced} "
          f"updated, {rep.kept} older kept out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
