"""Grading in stages: prepare, run, score, write.

This module holds the first: prepare() decides whether a submission is fit
to run, and returns Prepared (a checked module) or Refused (the verdict and
why, in the grader's words). Everything that runs a student's module calls
it: the grader (grade._grade) and the lab VM (explore.build). The later
stages are still in grade._grade.

What prepare does, in this order: intake (submission.intake_for_lab, in a
bounded child), flags on the source (objcheck.source_flags) and its review
against the lab's starter (objcheck.review: the diff, flags for changes
outside the fix), the confined build (lab.build_driver), the ELF check of
the module's imports (objcheck.check_elf), then its disassembled code
(objcheck.check_code). Text a student may read names the submission as the
student did and no host path, from where it is made: intake is told the
submission's shown name, the build its source's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import objcheck, report, submission
from .lab import BuildFailed, Lab, build_driver, build_text, disassemble
from .labspec import LabSpec

BUILD_FAILED = "build-failed"
UNCONFINED_FLAG = ("the build ran unconfined (--allow-unconfined-build): it could read any "
                   "file the grader can")


@dataclass(kw_only=True)
class Checked:
    """What prepare found, whether or not the module may run."""
    notes: list[str] = field(default_factory=list)     # for the student: what intake left out
    flags: list[str] = field(default_factory=list)     # for the instructor: all of them, in order
    diff: str = ""                                     # the submission against the starter
    # Of the flags, those about the code itself, which the lab VM shows its
    # student too (the review's and the confinement's are the grader's).
    source_flags: list[str] = field(default_factory=list)
    object_flags: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Prepared(Checked):
    """A module built and checked: fit to run."""
    ko: str
    warnings: list[str]          # the build's warning lines (any fails the build test)
    system_note: str = ""        # about the system, not the submission: shown, never charged
    confined: bool = True
    build_log: str = ""


@dataclass(kw_only=True)
class Refused(Checked):
    """A submission that must not run: the verdict code, and why in words a
    student may read."""
    verdict: str
    why: str
    build_log: str = ""          # what the build printed, when it ran


def prepare(spec: LabSpec, source: str, work_dir: str, *, shown: str, confined: bool,
            out_dir: str | None = None, build_dir: str | None = None,
            source_named: str = "", whole_build_log: bool = False) -> Prepared | Refused:
    """Intake, build and check one submission (source: a file, folder or archive).

    shown names the submission in intake's messages (grade.display_name, or the
    lab VM's path); source_named, if given, names the driver file in the build's
    messages (else the lab's name for it, e.g. ringdrv.c). Scratch goes in
    work_dir (a new or empty folder: one prepare each); the build (the .ko,
    build.log) in build_dir, by default work_dir/build; starter.diff in out_dir
    when given. A build that fails is refused with the compiler's error lines,
    or with all it printed when whole_build_log (the lab VM: the student's own
    build, read in a terminal)."""
    intake = submission.intake_for_lab(spec, source, os.path.join(work_dir, "intake"),
                                       bounded=True, shown=shown)
    if not intake.ok:
        # build_text: a member of an archive may be named by a host path.
        return Refused(verdict=intake.verdict, why=build_text(intake.describe()))
    checked = Checked(notes=[f"ignored {i.source}: {i.reason}" for i in intake.ignored])
    for taken in intake.taken:
        with open(taken.path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        hints = objcheck.source_flags(text)
        checked.flags += hints
        checked.source_flags += hints
        # For the instructor: the diff against the starter, and flags for
        # changes outside a fix's functions and for kernel-memory walking.
        try:
            with open(os.path.join(spec.dir, "starter", taken.name), encoding="utf-8") as f:
                starter = f.read()
        except OSError:
            continue
        rev = objcheck.review(starter, text, spec.fix_functions, taken.name)
        checked.flags += rev.flags
        checked.diff += rev.diff
        if rev.diff and out_dir:
            report.atomic_write(os.path.join(out_dir, "starter.diff"), checked.diff + "\n")
    if not confined:
        checked.flags.insert(0, UNCONFINED_FLAG)

    main = spec.files[0]
    named = source_named or main
    build_dir = build_dir or os.path.join(work_dir, "build")
    try:
        built = build_driver(Lab(spec.name, spec.module), intake.files()[main], build_dir,
                             timeout=spec.limits.build_timeout, confined=confined,
                             named=named)
    except BuildFailed as e:
        log = _read(os.path.join(build_dir, "build.log"))
        shown_log = log if whole_build_log and log else str(e)
        return Refused(verdict=BUILD_FAILED, why=f"{named} does not compile:\n{shown_log}",
                       build_log=log, **vars(checked))
    with open(built.ko, "rb") as f:
        found = objcheck.check_elf(f.read(), spec.symbol_allowed)
    if not found.verdict:
        try:
            found = objcheck.check_code(objcheck.parse_objdump(
                disassemble(built.ko, confined=confined)))
        except BuildFailed as e:
            found = objcheck.Findings(refused=[str(e)])
    checked.flags += found.flags
    checked.object_flags += found.flags
    if found.verdict:
        return Refused(verdict=found.verdict, why="the module was not run: " + found.why,
                       build_log=built.log, **vars(checked))
    return Prepared(ko=built.ko, warnings=built.warnings, system_note=built.system_note,
                    confined=built.confined, build_log=built.log, **vars(checked))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""
