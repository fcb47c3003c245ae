"""The class gradebook: one CSV row per student with the score of each test and
the replay information, written under a lock by parallel graders, and merged
from several hosts' results.json files and gradebook shards:

    PYTHONPATH=scripts python3 -m mmiolab merge -o gradebook.csv OUT_DIR...
"""

from __future__ import annotations

import csv
import fcntl
import io
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from .report import load_results_json
from .model import GradeResult, ReportError, atomic_write, clean_text, shown_number


FIXED_COLUMNS = ["student", "lab", "score", "max_score", "verdict"]
TAIL_COLUMNS = ["failed_tests", "flags", "confinement", "first_failing_seed", "seeds_passed", "seeds", "profile",
                "semantics", "params", "execution_time", "graded_at", "host", "kit",
                "submission", "console_log", "results"]
TEST_PREFIX = "test:"


# ---------------------------------------------------------------------------- gradebook

_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(text: str) -> str:
    """Keep spreadsheets from running a student-chosen id as a formula."""
    text = clean_text(text).replace("\n", " ")
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
        "score": shown_number(result.score), "max_score": shown_number(result.max_score),
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
        "confinement": _cell(result.confinement),
        "kit": _cell(str(result.key.get("kit", ""))), "submission": _cell(source),
    }
    for t in result.tests:
        row[TEST_PREFIX + t.name] = shown_number(t.score)
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
    """One writer at a time per gradebook on this host (parallel graders append).
    The lock file, path.lock, is removed on release, while still held. So a
    writer that gets the lock then checks that the file it locked is still the
    one at path.lock: if not, it waited on a removed file, which locks nothing
    any more, and it starts again."""
    lock = path + ".lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, lock):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)                    # closing also unlocks
    try:
        yield
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass                        # stays; the next writer uses it as it is
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)          # as os.open found it
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


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
                incoming: Iterable[dict[str, str]],
                report: MergeReport) -> tuple[list[str], list[dict[str, str]]]:
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


def update_gradebook(path: str, results: Iterable[GradeResult | tuple[Any, ...]]
                     ) -> MergeReport:
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
    """python3 -m mmiolab.gradebook merge ...: the command's merge
    (commands/merge.py), python3 -m mmiolab merge ..."""
    from .__main__ import main as command
    argv = list(sys.argv[1:] if argv is None else argv)
    return command(argv if argv[:1] == ["merge"] else ["merge", *argv])


if __name__ == "__main__":
    sys.exit(main())
