"""Grade submissions of a lab: one submission (grade_one), a batch (grade_batch),
and what a batch needs around it (ids, the resume key).

One submission goes through the stages of stages.py: prepare (take only the
files the lab allows, build them with the lab's own Kbuild and headers in a
sandbox, refuse modules whose imports or code the lab does not allow), run (a
fresh guest runs the lab's harness over the seeds; results are read only from
the nonce-marked harness channel), score, and write (results.json for
Gradescope, junit.xml, summary.txt, the gradebook row).
Nothing a submission does stops the batch: every failure becomes a verdict
with its reason. What a student sees names no host path.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import cast

from . import ROOT, kernel, model, report, roster, stages, submission, vm
from .config import Config
from .gradebook import update_gradebook
from .lab import RACE_CMDS, build_text, new_scratch, remove_stale_scratch
from .labspec import LabSpec
from .platforms import Platform


@dataclass
class GradeOptions:
    seeds: list[int]
    cmds: int = RACE_CMDS
    out: str = ""                  # default: build/grades
    resume: bool = False
    append: tuple[str, ...] = ()
    # The build's confinement level (sandbox.LEVELS), True for the one that
    # works here, False only when the instructor allowed none.
    confined: bool | str = True
    cfg: Config = field(kw_only=True)      # the command's (Config.from_env in __main__)
    # time.monotonic() by which a grading must be done (a platform's time
    # limit, less what the job needs around it); None: the lab's limits only.
    deadline: float | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self.out = self.out or os.path.join(self.cfg.build, "grades")


# What the outcome of grading depends on, besides the submission and the options:
# the grader (scripts/grade and the mmiolab modules it has loaded), the guest, the
# lab's tests, the kernel.
KIT_FILES = ["scripts/grade", "vm/init", "vm/record", "vm/harness-lib.sh", "vm/guest/*.c",
             "vm/guest/*.h"]
LAB_FILES = ["lab.toml", "*.h", "starter/Kbuild", "tests/*", "hidden/*", "hidden/*/*"]


def kit_version(spec: LabSpec, cfg: Config) -> str:
    """A digest of everything but the submission that a grade depends on."""
    h = hashlib.sha256()
    paths = [p for pat in KIT_FILES for p in glob.glob(os.path.join(ROOT, pat))]
    paths += [cast(str, m.__file__) for name, m in list(sys.modules.items())  # not None: below
              if name.startswith("mmiolab.") and getattr(m, "__file__", None)]
    paths += [p for pat in LAB_FILES for p in glob.glob(os.path.join(spec.dir, pat))]
    if spec.symbols_from:
        paths.append(os.path.join(os.path.dirname(spec.dir), spec.symbols_from, "lab.toml"))
    for p in sorted(set(paths)):
        if os.path.isfile(p):
            h.update(os.path.relpath(p, ROOT).encode() + b"\0")
            with open(p, "rb") as f:
                h.update(f.read())
    t = kernel.tree(cfg)
    if t.prebuilt:                  # a handout's or autograder's kernel: what built it
        h.update(json.dumps(kernel.prebuilt_info(), sort_keys=True).encode())
        return "sha256:" + h.hexdigest()[:16]
    try:
        with open(t.stamp, "rb") as f:
            stamp = json.load(f)
        h.update(json.dumps([stamp.get("source"), stamp.get("config")]).encode())
    except (OSError, ValueError):
        h.update(b"no kernel stamp")
    return "sha256:" + h.hexdigest()[:16]


def grading_key(spec: LabSpec, opts: GradeOptions, path: str) -> dict[str, object]:
    """Everything a result depends on; --resume re-grades when any of it differs."""
    return {"lab": spec.name, "seeds": [int(s) for s in opts.seeds], "cmds": int(opts.cmds),
            "append": list(opts.append), "kit": kit_version(spec, opts.cfg),
            "submission": submission.fingerprint(path, spec.files, spec.limits.intake())}


def entries_for(spec: LabSpec, paths: list[str]) -> list[tuple[str, str]]:
    """(student id, path) pairs for the command line's submissions; a folder without
    the lab's files is a class folder (one student per child). Ids are unique over
    the whole list and never a name the output folder uses itself."""
    out = []
    for p in paths:
        p = os.path.abspath(p)
        students = roster.expand_class(p) if os.path.isdir(p) and not any(
            os.path.exists(os.path.join(p, f)) for f in spec.files) else []
        if students:
            out += [(e.student_id, e.path) for e in students]
        else:
            name = roster.student_stem(os.path.basename(p.rstrip("/")))
            out.append((roster.safe_id(name or "submission"), p))
    ids = roster.unique_ids([sid for sid, _ in out])
    return [(sid, p) for sid, (_, p) in zip(ids, out)]


def display_name(path: str) -> str:
    """How a submission is named in what its student sees: its own name, no folders."""
    return submission.printable(os.path.basename(os.path.normpath(path))) or "submission"


def grade_one(spec: LabSpec, path: str, sub_id: str, opts: GradeOptions,
              key: dict[str, object] | None = None, *, gradebook: str = "",
              platform: Platform | None = None) -> model.GradeResult:
    """Grade one submission: the stages (stages.prepare, run, score), then its
    outputs under opts.out/sub_id (stages.write), its row in `gradebook`, and,
    graded in a platform's container, the platform's results file where the
    platform reads it (Platform.results_path of opts.cfg)."""
    t0 = time.monotonic()
    out_dir = os.path.join(opts.out, sub_id)
    os.makedirs(out_dir, exist_ok=True)
    work = new_scratch("grade", opts.cfg)
    try:
        key = key or grading_key(spec, opts, path)
        result = _grade(spec, path, sub_id, opts, out_dir, work)
        result.key = key
    except Exception as e:    # a grader bug must not lose the batch either
        result = stages.not_graded(spec, sub_id, "grader-error",
                                   build_text(f"internal grader error: {e!r}", cfg=opts.cfg))
        # For the instructor (never in what the student sees): where it broke.
        trace = traceback.format_exc()
        model.atomic_write(os.path.join(out_dir, "grader-error.txt"), trace)
        print(f"grade: {sub_id}: internal grader error (kept in "
              f"{os.path.join(out_dir, 'grader-error.txt')}):\n{trace}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.submission = display_name(path)
    result.execution_time = time.monotonic() - t0
    stages.write(result, out_dir, gradebook=gradebook, source=path, platform=platform,
                 platform_results=platform.results_path(opts.cfg) if platform else "")
    return result


def _grade(spec: LabSpec, path: str, sub_id: str, opts: GradeOptions, out_dir: str,
           work: str) -> model.GradeResult:
    """prepare, run, score."""
    ready = stages.prepare(spec, path, work, shown=display_name(path), confined=opts.confined,
                           out_dir=out_dir, cfg=opts.cfg)
    if isinstance(ready, stages.Refused):
        return stages.refused(spec, sub_id, ready, opts.seeds)
    ran = stages.run(spec, ready, opts.seeds, out_dir, cmds=opts.cmds, append=opts.append,
                     title=f"{sub_id}: the first failing run", cfg=opts.cfg,
                     deadline=opts.deadline)
    return stages.score(spec, sub_id, ready, ran)


def grade_batch(spec: LabSpec, entries: list[tuple[str, str]], opts: GradeOptions,
                jobs: int = 1,
                progress: Callable[[str], object] = print) -> list[model.GradeResult]:
    """Grade (student id, path) pairs, jobs at a time. The gradebook (opts.out/
    gradebook.csv) is rewritten after each submission, so a killed batch loses at
    most the submissions in flight; --resume keeps a finished result only if it
    was graded with the same key (grading_key) and not ended by a grader error."""
    book = os.path.join(opts.out, "gradebook.csv")
    os.makedirs(opts.out, exist_ok=True)
    stale = remove_stale_scratch(opts.cfg)
    if stale:
        progress(f"cleaned up after a grader that was killed: {len(stale)} scratch folder(s), "
                 "guest(s) and file(s)")
    todo, results, kept = [], [], []
    for sub_id, path in entries:
        key = grading_key(spec, opts, path)
        done = os.path.join(opts.out, sub_id, "results.json")
        if opts.resume and os.path.exists(done):
            why = _stale(done, key)
            if not why:
                old = report.load_results_json(done)
                progress(f"{sub_id:24} already graded (resume)")
                results.append(old)
                kept.append((old, done, path))
                continue
            progress(f"{sub_id:24} graded again: {why}")
        todo.append((sub_id, path, key))
    if kept:
        update_gradebook(book, kept)
    t0 = time.monotonic()
    lock = threading.Lock()
    finished = [0]

    def one(item: tuple[str, str, dict[str, object]]) -> model.GradeResult:
        sub_id, path, key = item
        r = grade_one(spec, path, sub_id, opts, key, gradebook=book)
        failed = ", ".join(t.name for t in r.failed) or "-"
        with lock:
            finished[0] += 1
            progress(f"{sub_id:24} {r.score:5.1f}/{r.max_score:<5.1f} {r.verdict:18} "
                     f"{r.execution_time:5.1f}s  failed: {failed}  "
                     f"[{finished[0]}/{len(todo)}, {time.monotonic() - t0:.0f}s]")
        return r

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures: list[Future[model.GradeResult]] = []
    try:
        futures.extend(pool.submit(one, item) for item in todo)
        for fut in futures:
            results.append(_result_heeding_signals(fut))
    except KeyboardInterrupt:
        # Ctrl-C reaches this thread alone: start no submission that has not
        # begun, end the guests the workers wait on (vm.stop_guests: those
        # runs write no result), wait for the workers. What finished stays
        # in the gradebook.
        pool.shutdown(wait=False, cancel_futures=True)
        stopped = vm.stop_guests()
        progress(f"interrupted: stopped {stopped} guest(s); graded {finished[0]} of "
                 f"{len(todo)}")
        pool.shutdown(wait=True)
        raise
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise
    pool.shutdown()
    return results


def _result_heeding_signals(fut: Future[model.GradeResult]) -> model.GradeResult:
    """fut.result(), waited for in short slices. Python runs a signal's
    handler (Ctrl-C's KeyboardInterrupt) in the main thread between bytecodes;
    a signal that lands just before that thread blocks in a lock wait with no
    timeout is acted on only when the wait ends, which for a grade can be
    minutes (seen once in make check: the suite's Ctrl-C test waited out its
    300 s guests)."""
    while True:
        try:
            return fut.result(timeout=0.5)
        except FutureTimeout:
            continue


def _stale(results_json: str, key: dict[str, object]) -> str:
    """Why a finished result must be graded again ('' if it stands)."""
    try:
        old = report.load_results_json(results_json)
    except model.ReportError as e:
        return f"its results.json is unreadable ({e})"
    if old.verdict in model.NOT_CHARGED:
        return ("it ended in a grader error" if old.verdict == "grader-error" else
                "the grading machine was too slow to grade it")
    for k in ("lab", "seeds", "cmds", "append", "kit", "submission"):
        if old.key.get(k) != key[k]:
            what = {"kit": "the grader, lab or kernel changed", "submission": "the submission "
                    "changed"}.get(k, f"{k} differ")
            return what
    return ""
