"""Grade submissions of a lab: intake, hermetic build, guest run, scoring, outputs.

One submission: take only the files the lab allows (submission.intake),
build them with the lab's own Kbuild and headers, refuse modules that import
forbidden symbols, boot a fresh guest that runs the lab's harness over the
seeds, read results only from the nonce-marked harness channel, and write
results.json (Gradescope), junit.xml and summary.txt. Nothing a submission
does stops the batch: every failure becomes a verdict with its reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import BUILD, ktap, report, submission
from .lab import BuildFailed, Lab, build_driver, run_tests
from .labspec import LabSpec, undefined_symbols

HARNESS_INFO = re.compile(r"# mmiolab harness: (.*)")


@dataclass
class GradeOptions:
    seeds: list[int]
    cmds: int = 10000
    out: str = os.path.join(BUILD, "grades")
    resume: bool = False
    append: tuple[str, ...] = ()


def fabric_append(spec: LabSpec) -> list[str]:
    """Kernel command-line words for the lab's fabric model."""
    words = []
    for key, val in spec.fabric.items():
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


def grade_one(spec: LabSpec, path: str, sub_id: str, opts: GradeOptions) -> report.GradeResult:
    """Grade one submission; writes its outputs under opts.out/sub_id."""
    t0 = time.monotonic()
    out_dir = os.path.join(opts.out, sub_id)
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"{sub_id}-", dir=_scratch_root())
    try:
        result = _grade(spec, path, sub_id, opts, out_dir, work)
    except Exception as e:    # a grader bug must not lose the batch either
        result = report.not_graded(spec, sub_id, "grader-error", f"internal grader error: {e!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.submission = path
    result.execution_time = time.monotonic() - t0
    report.write_all(result, out_dir)
    return result


def _scratch_root() -> str:
    d = os.path.join(BUILD, "scratch")
    os.makedirs(d, exist_ok=True)
    return d


def _grade(spec: LabSpec, path: str, sub_id: str, opts: GradeOptions, out_dir: str,
           work: str) -> report.GradeResult:
    intake = submission.intake_for_lab(spec, path, os.path.join(work, "intake"))
    if not intake.ok:
        return report.not_graded(spec, sub_id, intake.verdict, intake.describe())
    notes = [f"ignored {i.source}: {i.reason}" for i in intake.ignored]
    lab = Lab(spec.name, spec.module)
    source = intake.files()[spec.files[0]]
    try:
        built = build_driver(lab, source, os.path.join(work, "build"),
                             timeout=spec.limits.build_timeout)
    except BuildFailed as e:
        return report.not_graded(spec, sub_id, "build-failed",
                                 f"{spec.files[0]} does not compile:\n{e}", notes=notes)
    nm = subprocess.run(["nm", "-u", built.ko], capture_output=True, text=True)
    forbidden = spec.forbidden_symbols(undefined_symbols(nm.stdout))
    if forbidden:
        return report.not_graded(spec, sub_id, "forbidden-symbols",
                                 "the module uses kernel symbols this lab does not allow: "
                                 + ", ".join(forbidden), notes=notes)
    build_ok = not built.warnings
    host = {"build": _host_outcome(
        spec, "build", build_ok,
        "built with no warnings" if build_ok else
        "the build printed warnings:\n" + "\n".join(built.warnings[:20]))}

    run = run_tests(lab, built.ko, opts.seeds, out_dir, cmds=opts.cmds,
                    append=fabric_append(spec) + list(opts.append),
                    timeout=spec.limits.run_timeout)
    res = run.result
    parsed = ktap.parse(res.channel, nonce=run.nonce)
    events = ktap.scan_console(res.console)
    clean = res.status == "exited" and not events
    why = res.describe() if res.status != "exited" else ""
    if events:
        why = "; ".join(sorted({e.kind for e in events})) + " in the console log"
    host["clean_log"] = _host_outcome(
        spec, "clean_log", clean,
        "the console shows no warning, oops or lockdep report" if clean else
        f"{why}:\n{ktap.console_excerpt(res.console, events)}")
    tests = report.outcomes(spec, parsed, host)
    trusted, _, _ = ktap.trusted_lines(res.channel, run.nonce)
    info = next((m.group(1) for line in trusted if (m := HARNESS_INFO.search(line))), "")
    if res.status != "exited":
        notes.append(res.describe())
    return report.GradeResult(
        submission_id=sub_id, lab=spec.name, tests=tests,
        replay=_replay(spec, opts.seeds, parsed, info), console_log=res.log,
        verdict="graded", notes=notes,
        console_excerpt=ktap.console_excerpt(res.console, events) if events or not clean else "")


def grade_batch(spec: LabSpec, entries: list[tuple[str, str]], opts: GradeOptions,
                jobs: int = 1, progress=print) -> list[report.GradeResult]:
    """Grade (student id, path) pairs, jobs at a time; --resume skips finished ones."""
    todo, results = [], []
    for sub_id, path in entries:
        done = os.path.join(opts.out, sub_id, "results.json")
        if opts.resume and os.path.exists(done):
            progress(f"{sub_id:24} already graded (resume)")
            continue
        todo.append((sub_id, path))
    t0 = time.monotonic()
    lock = threading.Lock()
    finished = [0]

    def one(item):
        sub_id, path = item
        r = grade_one(spec, path, sub_id, opts)
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
