"""A graded submission as data: GradeResult, its TestOutcomes and the Replay
that re-runs it. The score stage (stages.py) makes one; report.py writes it
out for students and platforms, gradebook.py into the class gradebook.
Every file the kit writes for a grade is written whole (atomic_write): a
killed batch leaves the old file or the new one, never half of one, and
``--resume`` can trust what it finds.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import tempfile
from dataclasses import dataclass, field
from typing import Any

from . import MmiolabError

STATUSES = ("passed", "failed", "crashed", "error", "skipped")
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
RESULT_SCHEMA = 1
MAX_TEST_OUTPUT = 32 << 10
MAX_OUTPUT = 64 << 10


# A test's status in words (the reports' "why" of a test that did not pass).
WHY = {
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
    notice: str = ""                # in the student's summary even while the test is held

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
        # The fabric in the words FABRIC= and the trace headers use (the
        # field keeps its old name: results.json and gradebooks carry it).
        fabric = [f"profile {self.profile or '?'}", f"locking {self.semantics or '?'}"]
        fabric += [f"{k}={v}" for k, v in sorted(self.params.items())]
        return "; ".join(parts) + "; fabric: " + ", ".join(fabric)


# Verdicts that are the grader's failure, not the student's: no platform counts
# them. grader-too-slow: a guest was still making progress when its time ran
# out (vm.Patience: "slow"), the grading machine was too slow.
TOO_SLOW = "grader-too-slow"
NOT_CHARGED = ("grader-error", TOO_SLOW)


@dataclass
class GradeResult:
    """Everything the outputs need about one graded submission."""
    submission_id: str
    lab: str
    tests: list[TestOutcome]
    replay: Replay = field(default_factory=Replay)
    execution_time: float = 0.0          # the whole grading (the instructor's)
    # Of it, the hidden tests' guest: never in what a student sees before
    # publication, where its length could carry what the driver measured there.
    hidden_seconds: float = 0.0
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
    # What confined the build (sandbox.LEVELS: bubblewrap, jail; or unconfined);
    # "" when no build ran (refused at intake).
    confinement: str = ""
    graded_at: str = field(default_factory=lambda: _now())
    host: str = field(default_factory=socket.gethostname)

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    @property
    def visible_seconds(self) -> float:
        """The grading time a student may see: all but the hidden tests' run."""
        return max(0.0, self.execution_time - self.hidden_seconds)

    @property
    def failed(self) -> list[TestOutcome]:
        return [t for t in self.tests if t.status != "passed" or t.score < t.max_score]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _shell_quote(s: str) -> str:
    return s if re.fullmatch(r"[A-Za-z0-9_./:@%+=,-]+", s) else "'" + s.replace("'", "'\\''") + "'"


# ---------------------------------------------------------------------------- text of the reports
# Shared by every writer of a result (report.py, gradebook.py, platforms/*).

def shown_number(x: float) -> str:
    """A score as the reports show it: 2 for 2.0, 2.5 for 2.50."""
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0")


def cap_text(text: str, limit: int) -> str:
    """text cut to `limit` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def clean_text(text: str) -> str:
    """Text safe for XML 1.0 and JSON consumers: no control characters, no lone surrogates."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return _XML_BAD.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def clean_obj(obj: Any) -> Any:
    """Every string of a JSON document made valid UTF-8 (paths may carry undecodable bytes)."""
    if isinstance(obj, str):
        return obj.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(obj, dict):
        return {clean_obj(k): clean_obj(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_obj(v) for v in obj]
    return obj


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


