"""Grade submissions of a lab: intake, confined build, object checks, guest run,
scoring, outputs.

One submission: first stages.prepare (take only the files the lab allows,
build them with the lab's own Kbuild and headers in a sandbox, refuse modules
whose imports or code the lab does not allow), then boot a fresh guest that
runs the lab's harness over the seeds, read results only from the nonce-marked
harness channel, and write results.json (Gradescope), junit.xml and summary.txt.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import BUILD, ROOT, guestout, kernel, ktap, report, stages, submission
from .lab import Lab, build_text, new_scratch, remove_stale_scratch, run_tests
from .labspec import LabSpec


@dataclass
class GradeOptions:
    seeds: list[int]
    cmds: int = 10000
    out: str = os.path.join(BUILD, "grades")
    resume: bool = False
    append: tuple[str, ...] = ()
    confined: bool = True          # False only when the instructor allowed it


# What the outcome of grading depends on, besides the submission and the options:
# the grader (scripts/grade and the mmiolab modules it has loaded), the guest, the
# lab's tests, the kernel.
KIT_FILES = ["scripts/grade", "vm/init", "vm/record", "vm/guest/*.c"]
LAB_FILES = ["lab.toml", "*.h", "starter/Kbuild", "tests/*", "hidden/*", "hidden/*/*"]


def kit_version(spec: LabSpec) -> str:
    """A digest of everything but the submission that a grade depends on."""
    h = hashlib.sha256()
    paths = [p for pat in KIT_FILES for p in glob.glob(os.path.join(ROOT, pat))]
    paths += [m.__file__ for name, m in list(sys.modules.items())
              if name.startswith("mmiolab.") and getattr(m, "__file__", None)]
    paths += [p for pat in LAB_FILES for p in glob.glob(os.path.join(spec.dir, pat))]
    if spec.symbols_from:
        paths.append(os.path.join(os.path.dirname(spec.dir), spec.symbols_from, "lab.toml"))
    for p in sorted(set(paths)):
        if os.path.isfile(p):
            h.update(os.path.relpath(p, ROOT).encode() + b"\0")
            with open(p, "rb") as f:
                h.update(f.read())
    if kernel.USE_PREBUILT:         # a handout's or autograder's kernel: what built it
        h.update(json.dumps(kernel.prebuilt_info(), sort_keys=True).encode())
        return "sha256:" + h.hexdigest()[:16]
    try:
        with open(kernel.STAMP, "rb") as f:
            stamp = json.load(f)
        h.update(json.dumps([stamp.get("source"), stamp.get("config")]).encode())
    except (OSError, ValueError):
        h.update(b"no kernel stamp")
    return "sha256:" + h.hexdigest()[:16]


def grading_key(spec: LabSpec, opts: GradeOptions, path: str) -> dict:
    """Everything a result depends on; --resume re-grades when any of it differs."""
    return {"lab": spec.name, "seeds": [int(s) for s in opts.seeds], "cmds": int(opts.cmds),
            "append": list(opts.append), "kit": kit_version(spec),
            "submission": submission.fingerprint(path, spec.files,
                                                 submission.IntakeLimits.from_lab(spec.limits))}


def fabric_append(spec: LabSpec, hidden: bool = False) -> list[str]:
    """Kernel command-line words for the lab's fabric model (or the hidden
    tests' model: the lab's, with hidden/hidden.toml's overrides)."""
    words = []
    for key, val in (spec.hidden_fabric if hidden else spec.fabric).items():
        name = "locking" if key == "semantics" else key
        words.append(f"mmiosim.{name}={val}")
    return words


def _host_outcome(spec: LabSpec, name: str, ok: bool, output: str,
                  fraction: float = 1.0) -> report.TestOutcome:
    g = spec.test(name)
    return report.TestOutcome(name, g.points * fraction if ok else 0.0, g.points,
                              "passed" if ok else "failed", output, g.visibility, g.description)


def _replay(spec: LabSpec, seeds: list[int], parsed: ktap.ParseResult | None,
            info: str) -> report.Replay:
    params = dict(kv.split("=", 1) for kv in info.split() if "=" in kv)
    rep = report.Replay(seeds=list(seeds), profile=params.pop("profile", spec.fabric.get("profile", "")),
                        semantics=params.pop("locking", str(spec.fabric.get("semantics", ""))),
                        params={k: v for k, v in params.items()
                                if k in ("route_ns", "jitter_ns", "bridge_ns", "read_ns",
                                         "stall_ns", "stall_ppm")})
    # Seeds that passed every per-seed test; the first seed any of them failed.
    per_seed = [parsed.root.find(g.name) for g in spec.per_seed_tests] if parsed else []
    per_seed = [t for t in per_seed if t is not None and t.subtests]
    if per_seed:
        passing = [{t.name for t in test.subtests if t.status.ok} for test in per_seed]
        good = [all(f"seed_{s}" in p for p in passing) for s in seeds]
        rep.seeds_passed = sum(good)
        rep.first_failing_seed = next((s for s, ok in zip(seeds, good) if not ok), None)
    return rep


def entries_for(spec: LabSpec, paths: list[str]) -> list[tuple[str, str]]:
    """(student id, path) pairs for the command line's submissions; a folder without
    the lab's files is a class folder (one student per child). Ids are unique over
    the whole list and never a name the output folder uses itself."""
    out = []
    for p in paths:
        p = os.path.abspath(p)
        is_class = os.path.isdir(p) and not any(
            os.path.exists(os.path.join(p, f)) for f in spec.files) and any(
            os.path.isdir(os.path.join(p, c)) or c.endswith((".zip", ".tar.gz", ".tgz", ".tar", ".c"))
            for c in os.listdir(p))
        if is_class:
            out += [(e.student_id, e.path) for e in submission.expand_class(p)]
        else:
            name = os.path.basename(p.rstrip("/"))
            for ext in (".tar.gz", ".tgz", ".tar", ".zip", ".c"):
                name = name.removesuffix(ext)
            out.append((submission.safe_id(name or "submission"), p))
    ids = submission.unique_ids([sid for sid, _ in out])
    return [(sid, p) for sid, (_, p) in zip(ids, out)]


def display_name(path: str) -> str:
    """How a submission is named in what its student sees: its own name, no folders."""
    return submission.printable(os.path.basename(os.path.normpath(path))) or "submission"


def grade_one(spec: LabSpec, path: str, sub_id: str, opts: GradeOptions,
              key: dict | None = None) -> report.GradeResult:
    """Grade one submission; writes its outputs under opts.out/sub_id."""
    t0 = time.monotonic()
    out_dir = os.path.join(opts.out, sub_id)
    os.makedirs(out_dir, exist_ok=True)
    work = new_scratch("grade")
    try:
        key = key or grading_key(spec, opts, path)
        result = _grade(spec, path, sub_id, opts, out_dir, work)
        result.key = key
        if not result.replay.seeds:          # refused before the run: say what it would be
            result.replay = _replay(spec, opts.seeds, None, "")
    except Exception as e:    # a grader bug must not lose the batch either
        result = report.not_graded(spec, sub_id, "grader-error",
                                   build_text(f"internal grader error: {e!r}"))
        # For the instructor (never in what the student sees): where it broke.
        trace = traceback.format_exc()
        report.atomic_write(os.path.join(out_dir, "grader-error.txt"), trace)
        print(f"grade: {sub_id}: internal grader error (kept in "
              f"{os.path.join(out_dir, 'grader-error.txt')}):\n{trace}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.submission = display_name(path)
    result.execution_time = time.monotonic() - t0
    report.write_all(result, out_dir)
    return result


def _grade(spec: LabSpec, path: str, sub_id: str, opts: GradeOptions, out_dir: str,
           work: str) -> report.GradeResult:
    ready = stages.prepare(spec, path, work, shown=display_name(path), confined=opts.confined,
                           out_dir=out_dir)
    if isinstance(ready, stages.Refused):
        return report.not_graded(spec, sub_id, ready.verdict, ready.why, notes=ready.notes,
                                 flags=ready.flags, diff=ready.diff)
    notes, flags = ready.notes, ready.flags
    build_ok = not ready.warnings
    system = f"\n(not counted: {ready.system_note})" if ready.system_note else ""
    host = {"build": _host_outcome(
        spec, "build", build_ok,
        ("built with no warnings" if build_ok else
         "the build printed warnings:\n" + "\n".join(ready.warnings[:20])) + system)}

    lab = Lab(spec.name, spec.module)
    run = run_tests(lab, ready.ko, opts.seeds, out_dir, cmds=opts.cmds,
                    append=fabric_append(spec) + list(opts.append),
                    timeout=spec.limits.run_timeout, console_cap=spec.limits.console_cap)
    res = run.result
    # Every parser of guest output runs in a bounded child (guestout.py).
    seen = guestout.read_bounded(res.channel, res.console, run.nonce, out_dir,
                                 f"{sub_id}: the first failing run")
    parsed, events = seen.parsed, seen.events
    console = res.console           # the log the clean_log verdict quotes
    clean = res.status == "exited" and not events and not seen.problem
    why = res.describe() if res.status != "exited" else ""
    if events:
        why = "; ".join(sorted({e.kind for e in events})) + " in the console log"
    if seen.problem:
        why = seen.problem
        notes.append(seen.problem)
    hidden = None
    # What the hidden tests' run printed reaches only the hidden tests' own
    # outputs (their visibility), never clean_log, a note or the summary.
    hidden_trouble: list[str] = []
    hidden_unclean = False
    if spec.hidden_tests and res.status == "exited":
        # The hidden tests: a second guest, more CPUs, other routes.
        hrun = run_tests(lab, ready.ko, opts.seeds, os.path.join(out_dir, "hidden"),
                         cmds=opts.cmds,
                         append=fabric_append(spec, hidden=True) + list(opts.append),
                         timeout=spec.limits.run_timeout, console_cap=spec.limits.console_cap,
                         harness=spec.hidden_harness, smp=spec.hidden_smp)
        hseen = guestout.read_bounded(hrun.result.channel, hrun.result.console, hrun.nonce)
        hidden = hseen.parsed
        if hrun.result.status != "exited":
            hidden_trouble.append("the hidden tests' run: " + hrun.result.describe())
        if hseen.problem:
            hidden_trouble.append(hseen.problem)
        if hseen.events or hseen.problem:
            hidden_unclean = True
        if hseen.events:
            hidden_trouble.append(
                "; ".join(sorted({e.kind for e in hseen.events}))
                + " in the console log of the hidden tests' run: a hidden test passes only "
                  "with a clean console\n" + hseen.excerpt)
    host["clean_log"] = _host_outcome(
        spec, "clean_log", clean,
        "the console shows no warning, oops or lockdep report" if clean else
        f"{why}:\n{ktap.console_excerpt(console, events)}")
    tests = report.outcomes(spec, parsed, host, hidden)
    if any(t.values().get("flush") == "none" and t.status.ok
           for g in spec.ktap_tests if (t := parsed.root.find(g.name)) is not None):
        flags.append("the race passed with no flush the cost test could see (no read-back, "
                     "no mmiowb()): read how the fix orders the doorbell")
    if hidden_trouble:
        for t in tests:
            if spec.test(t.name).source != "hidden":
                continue
            t.output += "\n\n" + "\n".join(hidden_trouble)
            if hidden_unclean and t.status == "passed":
                t.status, t.score = "failed", 0.0
    picture = seen.picture
    if picture:
        failing = next((t for g in spec.per_seed_tests if g.source == "ktap"
                        for t in tests if t.name == g.name and t.status != "passed"), None)
        if failing is not None:
            failing.output += ("\n\n" + picture.text + "\nA picture of that run: race.html "
                               "(and race.svg) beside this report.")
            failing.html = picture.html
    info = seen.info
    if res.status != "exited":
        notes.append(res.describe())
    return report.GradeResult(
        submission_id=sub_id, lab=spec.name, tests=tests,
        replay=_replay(spec, opts.seeds, parsed, info),
        console_log=os.path.relpath(res.log, out_dir), verdict="graded", notes=notes,
        console_excerpt=ktap.console_excerpt(console, events) if events or not clean else "",
        flags=flags, diff=ready.diff)


def grade_batch(spec: LabSpec, entries: list[tuple[str, str]], opts: GradeOptions,
                jobs: int = 1, progress=print) -> list[report.GradeResult]:
    """Grade (student id, path) pairs, jobs at a time. The gradebook (opts.out/
    gradebook.csv) is rewritten after each submission, so a killed batch loses at
    most the submissions in flight; --resume keeps a finished result only if it
    was graded with the same key (grading_key) and not ended by a grader error."""
    book = os.path.join(opts.out, "gradebook.csv")
    os.makedirs(opts.out, exist_ok=True)
    stale = remove_stale_scratch()
    if stale:
        progress(f"removed {len(stale)} scratch folder(s) of a grader that was killed")
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
        report.update_gradebook(book, kept)
    t0 = time.monotonic()
    lock = threading.Lock()
    finished = [0]

    def one(item):
        sub_id, path, key = item
        r = grade_one(spec, path, sub_id, opts, key)
        report.update_gradebook(book, [(r, os.path.join(opts.out, sub_id, "results.json"),
                                        path)])
        failed = ", ".join(t.name for t in r.failed) or "-"
        with lock:
            finished[0] += 1
            progress(f"{sub_id:24} {r.score:5.1f}/{r.max_score:<5.1f} {r.verdict:18} "
                     f"{r.execution_time:5.1f}s  failed: {failed}  "
                     f"[{finished[0]}/{len(todo)}, {time.monotonic() - t0:.0f}s]")
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for r in pool.map(one, todo):
            results.append(r)
    return results


def _stale(results_json: str, key: dict) -> str:
    """Why a finished result must be graded again ('' if it stands)."""
    try:
        old = report.load_results_json(results_json)
    except report.ReportError as e:
        return f"its results.json is unreadable ({e})"
    if old.verdict == "grader-error":
        return "it ended in a grader error"
    for k in ("lab", "seeds", "cmds", "append", "kit", "submission"):
        if old.key.get(k) != key[k]:
            what = {"kit": "the grader, lab or kernel changed", "submission": "the submission "
                    "changed"}.get(k, f"{k} differ")
            return what
    return ""
