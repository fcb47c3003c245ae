"""A class's roster: which children of a class folder are students'
submissions (a folder, an archive or a .c file), the id each gets, and ids
made unique and kept off the names the grader's output folder uses itself.
What a submission holds is intake's (submission.py).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from .submission import (HIDDEN, NOT_ALLOWED, STUDENT_SUFFIXES, Ignored, SubmissionError,
                         printable)


class ClassEntry(NamedTuple):
    """One student of a class folder."""
    student_id: str
    path: str


@dataclass
class ClassScan:
    entries: list[ClassEntry]
    skipped: list[Ignored]


def is_student(name: str, st: os.stat_result) -> bool:
    """The roster rule: whether a class folder's child (its name, its lstat) is
    one student's submission: a folder, a link (intake refuses it by name:
    nothing lost) or, by its name, an archive or a .c file; never a hidden entry."""
    return not name.startswith(".") and (
        stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)
        or name.lower().endswith(STUDENT_SUFFIXES))


def student_stem(name: str) -> str:
    """A submission's name without its archive or .c suffix (alice.tar.gz: alice)."""
    lower = name.lower()
    for suf in STUDENT_SUFFIXES:
        if lower.endswith(suf) and len(name) > len(suf):
            return name[:-len(suf)]
    return name


def safe_id(name: str) -> str:
    """A student id usable as a folder name and a CSV cell: [A-Za-z0-9._@+-], no leading dot."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    text = re.sub(r"[^A-Za-z0-9._@+-]", "_", text).lstrip(".-")
    return text[:128] or "student"


def scan_class(class_dir: str) -> ClassScan:
    """Each child of a class folder that is a folder, an archive or a .c file is one
    student (symlinks included, so intake can refuse them by name: nothing lost);
    hidden and other files are skipped and reported. Ids are unique: when two
    children would share one (alice/ and alice.zip), both keep their full name."""
    try:
        names = sorted(os.listdir(class_dir))
    except OSError as e:
        raise SubmissionError(f"cannot read class folder {class_dir}: {e.strerror}") from e
    picked: list[tuple[str, str]] = []
    skipped: list[Ignored] = []
    for name in names:
        full = os.path.join(class_dir, name)
        if name.startswith("."):
            skipped.append(Ignored(printable(name), HIDDEN, "hidden entry"))
            continue
        if is_student(name, os.lstat(full)):
            picked.append((name, full))
        else:
            skipped.append(Ignored(printable(name), NOT_ALLOWED,
                                   "not a folder, archive or .c file"))
    stems = [safe_id(student_stem(n)) for n, _ in picked]
    ids: list[str] = []
    for (name, _), stem in zip(picked, stems):
        ids.append(safe_id(name) if stems.count(stem) > 1 else stem)
    seen: dict[str, int] = {}
    entries = []
    for (name, full), sid in zip(picked, ids):
        seen[sid] = seen.get(sid, 0) + 1
        entries.append(ClassEntry(sid if seen[sid] == 1 else f"{sid}~{seen[sid]}", full))
    return ClassScan(entries, skipped)


def expand_class(class_dir: str) -> list[ClassEntry]:
    """(student_id, submission path) for each student of a class folder."""
    return scan_class(class_dir).entries



#: Names the grader's output folder uses itself: no student gets them as an id.
RESERVED_IDS = frozenset({"gradebook.csv", "gradebook.csv.lock"})


def unique_ids(ids: Sequence[str]) -> list[str]:
    """The ids made unique (case-insensitively, for file systems that fold case) and
    kept off the reserved names: a repeat or a reserved one gets '~2', '~3'...
    Stable: the same list gives the same ids."""
    seen = {r.lower() for r in RESERVED_IDS}
    out = []
    for sid in ids:
        cand, n = sid, 1
        while cand.lower() in seen:
            n += 1
            cand = f"{sid}~{n}"
        seen.add(cand.lower())
        out.append(cand)
    return out
