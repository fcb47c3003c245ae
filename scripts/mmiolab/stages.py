"""Grading in stages: prepare, run, score, write.

  prepare  a submission: intake, confined build, object checks. Prepared (a
           checked module) or Refused (the verdict and why, in the grader's
           words). Called by the grader (grade._grade) and the lab VM
           (explore.build).
  run      the guests: the lab's visible tests, then (if the lab has them and
           the first guest finished) the hidden tests in a second guest; each
           run's output read in a bounded child (guestout). Ran. run_guest is
           one guest, also what labstats runs (labtest.run_variant).
  score    the trusted KTAP and the host's own checks (the build, a clean
           console) to points: a model.GradeResult. refused() scores a
           submission that never ran.
  write    a result to its outputs: results.json, junit.xml and summary.txt
           (report.write_all), a row of the gradebook, and, in a grading
           platform's container, that platform's results file
           (platforms.Platform.write_results). Written.

grade.grade_one runs them in this order for every submission, whether graded
from the command line, in a batch, by the demo or in an autograder's
container; nothing else scores one. The lab VM (explore.labvm) prepares the
student's module here and then boots its own interactive guest; labstats
(labtest) runs the lab's own variants with run_guest, or several in one guest.

What prepare does, in this order: intake (submission.intake_for_lab, in a
bounded child), flags on the source (objcheck.source_flags) and its review
against the lab's starter (objcheck.review: the diff, flags for changes
outside the fix), both in a bounded child too (objcheck.check_text), the
confined build (lab.build_driver), the ELF check of
the module's imports (objcheck.check_elf), then its disassembled code
(objcheck.check_code). Text a student may read names the submission as the
student did and no host path, from where it is made: intake is told the
submission's shown name, the build its source's.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from . import guestout, kernel, ktap, model, objcheck, report, speed, submission
from .config import Config
from .gradebook import MergeReport, update_gradebook
from .lab import (RACE_CMDS, BuildFailed, Run, build_driver, build_text, confinement_level,
                  disassemble, run_tests, scratch_root)
from .labspec import GradedTest, LabSpec, boot_words
from .platforms import Platform

BUILD_FAILED = "build-failed"
# A guest was still making progress when its time ran out (vm: "slow"):
# model.TOO_SLOW, in the student's words.
TOO_SLOW_WORDS = ("not graded: the grading machine was too slow to finish the tests in the time "
                  "it allows (they were still making progress when it ran out). This says "
                  "nothing about your driver and is not counted; your instructor is told.")
# A ring test whose only failures are commands the driver timed out and the
# card executed later, once, with no stale doorbell or descriptor (ringtest's
# 'starved=N'): the host starved the guest's vCPUs; model.TOO_SLOW too.
STARVED_WORDS = ("not graded: the grading machine starved the test guest's CPUs (commands "
                 "your driver timed out were all executed later by the card, once each, "
                 "with no sign of a race). This says nothing about your driver and is not "
                 "counted; your instructor is told.")
# A guest whose clock ran faster than the host's (vm.RunResult.clock_ratio over
# FAST_CLOCK): its timeouts, the driver's and the tests', fired early. A run
# that failed there is the grading machine's fault: "grader-error".
FAST_CLOCK = 1.5
FAST_CLOCK_WORDS = ("not graded: the test guest's clock ran faster than real time (the "
                    "grading machine was overloaded), so timeouts in your driver and in the "
                    "tests fired early. This says nothing about your driver and is not "
                    "counted; your instructor is told.")
# A guest that went down before its harness started (vm.RunResult.boot_seconds
# None), twice (lab.run_tests boots once more): the driver was not loaded yet.
NO_BOOT_WORDS = ("not graded: the test guest failed while booting, before your driver was "
                 "loaded (twice): a fault of the grading machine, not of your driver; not "
                 "counted, and your instructor is told.")
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
    # The build's confinement (sandbox.LEVELS, or "unconfined"); "" if none ran.
    confinement: str = ""


@dataclass(kw_only=True)
class Prepared(Checked):
    """A module built and checked: fit to run."""
    ko: str
    warnings: list[str]          # the build's warning lines (any fails the build test)
    system_note: str = ""        # about the system, not the submission: shown, never charged
    confined: bool | str = True  # the level that ran (sandbox.LEVELS), or False
    build_log: str = ""


@dataclass(kw_only=True)
class Refused(Checked):
    """A submission that must not run: the verdict code, and why in words a
    student may read."""
    verdict: str
    why: str
    build_log: str = ""          # what the build printed, when it ran


def prepare(spec: LabSpec, source: str, work_dir: str, *, shown: str, confined: bool | str,
            out_dir: str | None = None, build_dir: str | None = None,
            source_named: str = "", whole_build_log: bool = False,
            cfg: Config) -> Prepared | Refused:
    """Intake, build and check one submission (source: a file, folder or archive).

    shown names the submission in intake's messages (grade.display_name, or the
    lab VM's path); source_named, if given, names the driver file in the build's
    messages (else the lab's name for it, e.g. ringdrv.c). Scratch goes in
    work_dir (a new or empty folder: one prepare each); the build (the .ko,
    build.log) in build_dir, by default work_dir/build; starter.diff in out_dir
    when given. A build that fails is refused with the compiler's error lines,
    or with all it printed when whole_build_log (the lab VM: the student's own
    build, read in a terminal). cfg: the kit's configuration (the command's)."""
    intake = submission.intake_for_lab(spec, source, os.path.join(work_dir, "intake"),
                                       bounded=True, shown=shown)
    if not intake.ok:
        # build_text: a member of an archive may be named by a host path.
        return Refused(verdict=intake.verdict, why=build_text(intake.describe(), cfg=cfg))
    checked = Checked(notes=[f"ignored {i.source}: {i.reason}" for i in intake.ignored],
                      confinement=confinement_level(confined, cfg))
    macros = kernel_macros_file(cfg)
    for taken in intake.taken:
        # In a bounded child, as intake: the source's flags, and for the
        # instructor the diff against the starter and flags for changes
        # outside a fix's functions and for kernel-memory walking.
        starter = os.path.join(spec.dir, "starter", taken.name)
        hints, rev = objcheck.check_text(taken.path, starter if os.path.isfile(starter) else None,
                                         spec.fix_functions, taken.name, macros)
        checked.flags += hints
        checked.source_flags += hints
        checked.flags += rev.flags
        checked.diff += rev.diff
        if rev.diff and out_dir:
            model.atomic_write(os.path.join(out_dir, "starter.diff"), checked.diff + "\n")
    if not confined:
        checked.flags.insert(0, UNCONFINED_FLAG)

    main = spec.files[0]
    named = source_named or main
    build_dir = build_dir or os.path.join(work_dir, "build")
    try:
        built = build_driver(spec, intake.files()[main], build_dir, confined=confined,
                             named=named, cfg=cfg)
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
                disassemble(built.ko, confined=confined, cfg=cfg)))
        except BuildFailed as e:
            found = objcheck.Findings(refused=[str(e)])
    checked.flags += found.flags
    checked.object_flags += found.flags
    if found.verdict:
        return Refused(verdict=found.verdict, why="the module was not run: " + found.why,
                       build_log=built.log, **vars(checked))
    return Prepared(ko=built.ko, warnings=built.warnings, system_note=built.system_note,
                    confined=built.confined, build_log=built.log, **vars(checked))


def kernel_macros_file(cfg: Config) -> str:
    """The lab kernel's macros as the review needs them (objcheck.KernelMacros:
    its configuration and every name its headers define), kept as JSON next to
    the scratch folders and made again when the kernel's configuration is newer;
    "" without a configured kernel (the review then decides less, and says
    so)."""
    t = kernel.tree(cfg)
    autoconf = os.path.join(t.obj, "include", "generated", "autoconf.h")
    try:
        stamp = os.stat(autoconf).st_mtime_ns
    except OSError:
        return ""
    path = os.path.join(scratch_root(cfg), f"kernel-macros-{stamp}.json")
    if not os.path.exists(path):
        roots = [os.path.join(t.src, "include"), os.path.join(t.src, "arch", "x86", "include"),
                 os.path.join(t.obj, "include"), os.path.join(t.obj, "arch", "x86", "include")]
        found = objcheck.kernel_macros([r for r in roots if os.path.isdir(r)], autoconf)
        model.atomic_write(path, json.dumps(found.to_dict()))
    return path


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ---------------------------------------------------------------------------- run

def fabric_params(spec: LabSpec, hidden: bool = False) -> dict[str, str]:
    """The lab's fabric model (or the hidden tests': the lab's, with
    hidden/hidden.toml's overrides), as the kernel's parameters' values."""
    return {key: f"{val}" for key, val in (spec.hidden_fabric if hidden else spec.fabric).items()}


def fabric_append(spec: LabSpec, hidden: bool = False) -> list[str]:
    """Kernel command-line words for the lab's fabric model (fabric_params)."""
    return boot_words(fabric_params(spec, hidden))


@dataclass(kw_only=True)
class Ran:
    """What the guests did with a prepared module, read on the host."""
    visible: Run                               # the lab's own tests: the first guest
    seen: guestout.GuestOutput                 # its channel and console, read
    out_dir: str                               # where its console log is
    hidden: Run | None = None                  # the hidden tests' guest, if it ran
    hidden_seen: guestout.GuestOutput | None = None
    hidden_seconds: float = 0.0                # its wall time, booting and reading too
    # The hidden tests' guest was not started: too little of the grading's
    # time was left (run's deadline). Not the driver's: model.TOO_SLOW.
    out_of_time: str = ""


#: The guest kernel's own lockup detectors, in seconds (6.12 defaults:
#: CONFIG_RCU_CPU_STALL_TIMEOUT 21, watchdog_thresh 10, a soft lockup at
#: twice that) and the most each takes (kernel/rcu/tree_stall.h clamps the
#: stall timeout to 300 s; the watchdog_thresh sysctl's maximum is 60).
RCU_STALL_S, RCU_STALL_MOST = 21, 300
WATCHDOG_S, WATCHDOG_MOST = 10, 60


def detector_append(factor: float) -> list[str]:
    """Kernel command-line words that give the guest's RCU stall and soft
    lockup detectors the patience the host gives the run (factor: its limits'
    scale, speed.slowdown). Under TCG a guest's clock is the host's, so on a
    CPU share the detectors count time its vCPUs did not run: a correct driver
    was reported as an RCU stall, and an unclean console is the driver's.
    Scaled, each still fires well before the host's own stall limit
    (stall_timeout, 60 s scaled), so a real lockup is still named."""
    if factor <= 1.0:
        return []
    return [f"rcupdate.rcu_cpu_stall_timeout={min(RCU_STALL_MOST, round(RCU_STALL_S * factor))}",
            f"watchdog_thresh={min(WATCHDOG_MOST, round(WATCHDOG_S * factor))}"]


def run_guest(spec: LabSpec, ko: str, seeds: list[int], log_dir: str, *, hidden: bool = False,
              cmds: int = RACE_CMDS, append: list[str] | tuple[str, ...] = (),
              timeout: float | None = None, console_cap: int | None = None,
              cfg: Config, deadline: float | None = None) -> Run:
    """One guest: the lab's harness (hidden: the hidden tests', with their CPUs and
    fabric) over the seeds, under the lab's fabric plus `append`. The console
    limit is the lab's unless given. A timeout given is the run's whole time;
    else the lab's limits, scaled to this machine (speed.slowdown), tell slow
    from stuck (vm.Patience): no progress for stall_timeout is a hang, the
    ceiling reached while progressing is "slow". A deadline (time.monotonic())
    cuts the ceiling and the stall limit short: a run still progressing then is
    "slow" too."""
    kw: dict[str, Any] = {"harness": spec.hidden_harness, "smp": spec.hidden_smp} \
        if hidden else {}
    factor = 1.0
    if timeout is None:
        lim = spec.limits
        factor = speed.slowdown(spec.hidden_smp if hidden else cfg.smp,
                                lim.max_slowdown)
        timeout = lim.run_timeout * factor
        kw["stall_timeout"] = lim.stall_timeout * factor
        if deadline is not None:
            timeout = max(1.0, min(timeout, deadline - time.monotonic()))
            kw["stall_timeout"] = min(kw["stall_timeout"], timeout)
    return run_tests(spec, ko, seeds, log_dir, cmds=cmds,
                     append=fabric_append(spec, hidden=hidden) + list(append)
                     + detector_append(factor), timeout=timeout,
                     console_cap=spec.limits.console_cap if console_cap is None else console_cap,
                     cfg=cfg, **kw)


#: The least time worth starting the hidden tests' guest in (seconds, before
#: scaling): its boot alone takes 2-5 s on two CPUs, its runs tens of seconds.
MIN_HIDDEN_RUN = 30.0


def run(spec: LabSpec, ready: Prepared, seeds: list[int], out_dir: str, *, cmds: int = RACE_CMDS,
        append: list[str] | tuple[str, ...] = (), title: str = "",
        cfg: Config, deadline: float | None = None) -> Ran:
    """Run a prepared module: the visible tests in a guest (its logs, and the
    picture of a failing run titled `title`, in out_dir), then, if the lab has
    hidden tests and that guest finished, the hidden tests in a second one
    (out_dir/hidden). Every parser of guest output runs in a bounded child
    (guestout.read_bounded). With a deadline (a platform's time limit), each
    guest's ceiling ends there (one whose progress stopped just before it
    still gets its stall limit: vm.Patience), and the hidden guest starts
    only with MIN_HIDDEN_RUN (scaled to this machine) left."""
    visible = run_guest(spec, ready.ko, seeds, out_dir, cmds=cmds, append=append, cfg=cfg,
                        deadline=deadline)
    res = visible.result
    ran = Ran(visible=visible, out_dir=out_dir,
              seen=guestout.read_bounded(res.channel, res.console, visible.nonce, out_dir, title,
                                         kernel.tree(cfg).src))
    if spec.hidden_tests and res.status == "exited":
        # The hidden tests: a second guest, more CPUs, other routes.
        t0 = time.monotonic()
        least = MIN_HIDDEN_RUN * speed.slowdown(spec.hidden_smp, spec.limits.max_slowdown)
        if deadline is not None and deadline - t0 < least:
            ran.out_of_time = (f"the hidden tests' guest was not started: {deadline - t0:.0f}s "
                               f"of the grading's time limit were left, under {least:.0f}s")
            return ran
        ran.hidden = run_guest(spec, ready.ko, seeds, os.path.join(out_dir, "hidden"),
                               hidden=True, cmds=cmds, append=append, cfg=cfg,
                               deadline=deadline)
        ran.hidden_seen = guestout.read_bounded(ran.hidden.result.channel,
                                                ran.hidden.result.console, ran.hidden.nonce)
        ran.hidden_seconds = time.monotonic() - t0
    return ran


# ---------------------------------------------------------------------------- score

def status_word(status: ktap.Status) -> str:
    return {ktap.Status.PASS: "passed", ktap.Status.FAIL: "failed", ktap.Status.SKIP: "skipped",
            ktap.Status.ERROR: "error", ktap.Status.CRASHED: "crashed"}[status]


def plain_words(test: ktap.Test, phrases: dict[str, str]) -> list[str]:
    """One sentence per test case that did not pass: its measurements in words
    (phrases: the lab's, key -> "{} words"), or why it never reported."""
    out = []
    for t in test.walk():
        if t.status is ktap.Status.PASS or (t.subtests and t is not test):
            continue
        if t.subtests:                    # the test itself, when its cases say more
            out += [f"{t.name or 'the run'}: {e}" for e in t.errors]
            continue
        vals = t.values()
        said = [p.format(vals[k]) for k, p in phrases.items()
                if vals.get(k, "0") not in ("0", "")]
        label = t.name or (f"test {t.number}" if t.number else "the test")
        if said:
            out.append(f"{label}: " + ", ".join(said))
        elif t.errors:
            out.append(f"{label}: " + "; ".join(t.errors))
        elif t.status is ktap.Status.SKIP and t.reason:
            out.append(f"{label}: skipped: {t.reason}")
        elif t.reason:
            out.append(f"{label}: {t.reason}")
    return out


def outcome_from_ktap(graded: GradedTest, test: ktap.Test,
                      phrases: dict[str, str]) -> model.TestOutcome:
    """Score one harness-reported test of a lab (graded: a labspec.GradedTest;
    phrases: the lab's words for its measurements, LabSpec.phrases).

    A pass earns the points; for a test with a credit table (lab.toml's
    credit_by and credit: the doorbell lab's cost test), the share its row
    gives for what the harness measured, and nothing for a value the table
    does not list. Anything but a pass earns nothing.
    """
    status = status_word(test.status)
    points = 0.0
    passed = test.status is ktap.Status.PASS
    credit = graded.credit_for(test.values()) if graded.credit_by else None
    if passed:
        share = credit.share if credit else 0.0 if graded.credit_by else 1.0
        points = round(graded.points * share, 2)
    body = [graded.description, "", f"result: {status}" + (
        f" ({test.directive} {test.reason})".rstrip() if test.directive else "")]
    body += [f"why: {w}" for w in plain_words(test, phrases)]
    if passed and graded.credit_by:
        if credit is None:
            said = test.values().get(graded.credit_by)
            body.append(f"why: the harness reported {graded.credit_by}="
                        f"{said if said else '(nothing)'}, which this lab gives no points")
        elif credit.why:
            body.append(f"why: {credit.why}")
    detail = test.text().strip("\n")
    if detail:
        body += ["", detail]
    return model.TestOutcome(name=graded.name, score=points, max_score=graded.points,
                              status=status, output="\n".join(body),
                              visibility=graded.visibility, description=graded.description)


def credit_flags(spec: LabSpec, parsed: ktap.ParseResult) -> list[str]:
    """The instructor's flags of the visible run's passing tests whose credit
    row has one (lab.toml: the doorbell lab's cost test with flush=none)."""
    flags = []
    for g in spec.ktap_tests:
        ktest = parsed.root.find(g.name)
        if g.credit_by and ktest is not None and ktest.status is ktap.Status.PASS:
            credit = g.credit_for(ktest.values())
            if credit is not None and credit.flag:
                flags.append(credit.flag)
    return flags


def outcomes(spec: LabSpec, parsed: ktap.ParseResult, host: dict[str, model.TestOutcome],
             hidden: ktap.ParseResult | None = None) -> list[model.TestOutcome]:
    """All the lab's tests in its order: host-decided ones from `host`, the others
    from the trusted KTAP of the visible run or of the hidden tests' run (missing =
    crashed). A host test with no entry errors; hidden tests with no hidden run
    error too. A derived test (all_of) errors here: derive() decides it once
    its parts are final."""
    found = parsed.expect(t.name for t in spec.ktap_tests)
    found_hidden = hidden.expect(t.name for t in spec.hidden_tests) if hidden else {}
    out = []
    for g in spec.tests:
        if g.source in ("host", "derived"):
            out.append(host.get(g.name) or model.TestOutcome(
                g.name, 0.0, g.points, "error", f"{g.description}\n\nnot evaluated",
                g.visibility, g.description))
        elif g.source == "hidden" and g.name not in found_hidden:
            out.append(model.TestOutcome(g.name, 0.0, g.points, "error",
                                          f"{g.description}\n\nthe hidden tests did not run",
                                          g.visibility, g.description))
        elif g.source == "hidden":
            out.append(outcome_from_ktap(g, found_hidden[g.name], spec.phrases))
        else:
            out.append(outcome_from_ktap(g, found[g.name], spec.phrases))
    return out


def derive(spec: LabSpec, tests: list[model.TestOutcome]) -> None:
    """Decide the lab's derived tests (lab.toml's all_of) from their parts'
    final outcomes, in place: passed, with the points, only if every part
    passed; failed if a part failed, crashed or was skipped; else an error
    (a part that never ran: a run the grading machine cut short, or hidden
    tests after a visible run that did not finish). Its output names the
    parts that did not pass. (Issue 33: a race in a hidden run takes the
    race marks as one in the visible run does.)"""
    by_name = {t.name: t for t in tests}
    for i, t in enumerate(tests):
        g = spec.test(t.name)
        if not g.all_of:
            continue
        parts = [by_name[n] for n in g.all_of]
        bad = [p for p in parts if p.status != "passed"]
        status = ("failed" if any(p.status != "error" for p in bad) else
                  "error" if bad else "passed")
        body = [g.description, "", f"result: {status}"]
        body += [f"why: {p.name}: {p.status}" for p in bad]
        if not bad:
            body.append("passed: " + ", ".join(g.all_of))
        tests[i] = model.TestOutcome(g.name, g.points if status == "passed" else 0.0,
                                     g.points, status, "\n".join(body), g.visibility,
                                     g.description, notice=g.notice)


def not_graded(spec: LabSpec, submission_id: str, verdict: str, why: str,
               **kw: Any) -> model.GradeResult:
    """A result for a submission that never reached the guest (refused at intake,
    failed to build, a grader error...): every test 0, the reason in every output."""
    tests = [model.TestOutcome(g.name, 0.0, g.points, "error",
                                f"{g.description}\n\nnot run: {why}", g.visibility,
                                g.description) for g in spec.tests]
    return model.GradeResult(submission_id=submission_id, lab=spec.name, tests=tests,
                              verdict=verdict, notes=[why] + list(kw.pop("notes", [])), **kw)


FABRIC_CHANGED = ("the driver tampered with the fabric's settings or the card's counters, "
                  "which the kernel keeps read-only and no honest driver touches: ")


def host_outcome(spec: LabSpec, name: str, ok: bool, output: str,
                 fraction: float = 1.0) -> model.TestOutcome:
    """A test the host decides (the build, a clean console), scored."""
    g = spec.test(name)
    return model.TestOutcome(name, g.points * fraction if ok else 0.0, g.points,
                              "passed" if ok else "failed", output, g.visibility, g.description)


# Of the fabric's params line (its debugfs params file, which the harness
# prints), what a replay records besides profile and locking: the kernel's
# names, the same for every lab (the seed is recorded apart), clock (real
# or skip: how the guest waits for the fabric) included.
REPLAY_PARAMS = ("route_ns", "jitter_ns", "bridge_ns", "read_ns", "stall_ns", "stall_ppm",
                 "clock")


def replay(spec: LabSpec, seeds: list[int], parsed: ktap.ParseResult | None,
           info: str) -> model.Replay:
    """How to run it again: the seeds, the fabric the harness said it ran
    (its '# mmiolab harness:' line, `info`), the seeds that passed."""
    params = dict(kv.split("=", 1) for kv in info.split() if "=" in kv)
    # The report's field is still called semantics (results.json, the gradebook).
    rep = model.Replay(seeds=list(seeds), profile=params.pop("profile", spec.fabric.get("profile", "")),
                        semantics=params.pop("locking", str(spec.fabric.get("locking", ""))),
                        params={k: v for k, v in params.items() if k in REPLAY_PARAMS})
    # Seeds that passed every per-seed test; the first seed any of them failed.
    found = [parsed.root.find(g.name) for g in spec.per_seed_tests] if parsed else []
    per_seed = [t for t in found if t is not None and t.subtests]
    if per_seed:
        passing = [{t.name for t in test.subtests if t.status.ok} for test in per_seed]
        good = [all(f"seed_{s}" in p for p in passing) for s in seeds]
        rep.seeds_passed = sum(good)
        rep.first_failing_seed = next((s for s, ok in zip(seeds, good) if not ok), None)
    return rep


def refused(spec: LabSpec, sub_id: str, why: Refused, seeds: list[int]) -> model.GradeResult:
    """The score of a submission that never ran: every test 0, the reason in
    every output, and what a run would have been."""
    result = not_graded(spec, sub_id, why.verdict, why.why, notes=why.notes,
                               flags=why.flags, diff=why.diff, confinement=why.confinement)
    result.replay = replay(spec, seeds, None, "")
    return result


def score(spec: LabSpec, sub_id: str, ready: Prepared, ran: Ran) -> model.GradeResult:
    """The lab's tests scored: the build and a clean console (host tests), the
    rest from the trusted KTAP of the visible run and of the hidden tests'
    run. What the hidden tests' run printed reaches only the hidden tests' own
    outputs (their visibility), never clean_log, a note or the summary."""
    notes, flags = list(ready.notes), list(ready.flags)
    res, seen = ran.visible.result, ran.seen
    parsed, events = seen.parsed, seen.events
    console = res.console           # the log the clean_log verdict quotes
    build_ok = not ready.warnings
    system = f"\n(not counted: {ready.system_note})" if ready.system_note else ""
    host = {"build": host_outcome(
        spec, "build", build_ok,
        ("built with no warnings" if build_ok else
         "the build printed warnings:\n" + "\n".join(ready.warnings[:20])) + system)}
    clean = res.status == "exited" and not events and not seen.problem
    why = res.describe() if res.status != "exited" else ""
    if events:
        why = "; ".join(sorted({e.kind for e in events})) + " in the console log"
    if seen.problem:
        why = seen.problem
        notes.append(seen.problem)
    hidden = None
    hidden_trouble: list[str] = []
    hidden_unclean = False
    if ran.hidden is not None and ran.hidden_seen is not None:
        hres, hseen = ran.hidden.result, ran.hidden_seen
        hidden = hseen.parsed
        if hres.status != "exited":
            hidden_trouble.append("the hidden tests' run: " + hres.describe())
        if hseen.problem:
            hidden_trouble.append(hseen.problem)
        if hseen.events or hseen.problem:
            hidden_unclean = True
        if hseen.events:
            hidden_trouble.append(
                "; ".join(sorted({e.kind for e in hseen.events}))
                + " in the console log of the hidden tests' run: a hidden test passes only "
                  "with a clean console\n" + hseen.excerpt)
    host["clean_log"] = host_outcome(
        spec, "clean_log", clean,
        "the console shows no warning, oops or lockdep report" if clean else
        f"{why}:\n{ktap.console_excerpt(console, events)}")
    tests = outcomes(spec, parsed, host, hidden)
    flags += credit_flags(spec, parsed)
    for where, run_seen in (("", seen), ("the hidden tests' run: ", ran.hidden_seen)):
        if run_seen is not None and run_seen.fabric_changed:
            flags.append(FABRIC_CHANGED + where + run_seen.fabric_changed)
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
    if res.status != "exited":
        notes.append(res.describe())
    if ran.out_of_time:
        notes.append(ran.out_of_time)
    verdict, words = "graded", ""
    runs = [r.result for r in (ran.visible, ran.hidden) if r is not None]
    slow = [r for r in runs if r.status == "slow"]
    unbooted = [r for r in runs if r.status != "exited" and r.boot_seconds is None]
    starved = starved_tests(spec, parsed, hidden)
    fast = [r for r in runs if (r.clock_ratio or 0.0) > FAST_CLOCK]
    if slow or ran.out_of_time:
        # clean_log failed only because the run did not finish: not the driver's.
        verdict, words = model.TOO_SLOW, TOO_SLOW_WORDS
        _not_charged(spec, tests, TOO_SLOW_WORDS,
                     slow[0].describe() if slow else ran.out_of_time,
                     clean_log=res.status == "slow" and not events and not seen.problem)
    elif unbooted:
        # What its console shows is the boot's, before the driver was loaded.
        verdict, words = "grader-error", NO_BOOT_WORDS
        _not_charged(spec, tests, NO_BOOT_WORDS, unbooted[0].describe(),
                     clean_log=res.boot_seconds is None)
    elif fast and any(t.status != "passed" for t in tests if ran_in_guest(spec, t)):
        # A pass on a fast clock stands (its timeouts only came sooner).
        verdict, words = "grader-error", FAST_CLOCK_WORDS
        why = f"the guest's clock ran {fast[0].clock_ratio:.1f} times as fast as the host's"
        notes.append(why)
        for t in tests:
            if ran_in_guest(spec, t) and t.status != "passed":
                t.status, t.score = "error", 0.0
                t.output += f"\n\n{FAST_CLOCK_WORDS}\n({why})"
    elif starved and clean and not hidden_unclean:
        # Lateness is excused only on clean consoles: a warning is the driver's.
        verdict, words = model.TOO_SLOW, STARVED_WORDS
        for t in tests:
            if t.name in starved:
                t.status, t.score = "error", 0.0
                t.output += f"\n\n{STARVED_WORDS}\n({starved[t.name]})"
    derive(spec, tests)
    if words:
        notes.insert(0, words)
    return model.GradeResult(
        submission_id=sub_id, lab=spec.name, tests=tests,
        replay=replay(spec, ran.visible.seeds, parsed, seen.info),
        console_log=os.path.relpath(res.log, ran.out_dir),
        verdict=verdict, notes=notes,
        console_excerpt=ktap.console_excerpt(console, events) if events or not clean else "",
        flags=flags, diff=ready.diff, hidden_seconds=ran.hidden_seconds,
        confinement=ready.confinement)


def ran_in_guest(spec: LabSpec, t: model.TestOutcome) -> bool:
    """Whether a test's outcome came from a guest's run (its harness or its
    console), not from the build or from other tests (derived, decided later)."""
    return t.name != "build" and spec.test(t.name).source != "derived"


def starved_tests(spec: LabSpec, *parsed: ktap.ParseResult | None) -> dict[str, str]:
    """The guest-run tests that failed only because the guest was starved: each
    failing case (a seed's, or the test itself where it has none) says
    ringtest's 'starved=N'. Name -> what they said; none if any test failed
    otherwise, in any run: a race or an error seen anywhere is graded."""
    out: dict[str, str] = {}
    for p in parsed:
        if p is None:
            continue
        for g in spec.ktap_tests + spec.hidden_tests:
            test = p.root.find(g.name)
            if test is None or test.status.ok:
                continue
            failing = [c for c in test.subtests if not c.status.ok] if test.subtests \
                else [test]
            if not failing:
                return {}                # failed, but no case did: not lateness
            said = [c.values().get("starved", "") for c in failing]
            if not all(v.isdigit() and int(v) > 0 for v in said):
                return {}
            out[g.name] = "; ".join(f"{c.name}: starved={v}" for c, v in zip(failing, said))
    return out


def _not_charged(spec: LabSpec, tests: list[model.TestOutcome], words: str, why: str,
                 clean_log: bool) -> None:
    """A run ended by the grading machine's fault (too slow, or down before the
    harness started): the tests it never reported (crashed, or not run) and,
    if `clean_log`, clean_log are errors in `words`, the grader's, never the
    driver's; what did report stands, for the instructor."""
    for t in tests:
        g = spec.test(t.name)
        if t.name == "clean_log":
            if not clean_log or t.status == "passed":
                continue
        elif g.source == "host" or t.status in ("passed", "failed", "skipped"):
            continue
        t.status, t.score = "error", 0.0
        t.output = f"{g.description}\n\n{words}\n({why})"


# ---------------------------------------------------------------------------- write

@dataclass(kw_only=True)
class Written:
    """Where a result went."""
    files: dict[str, str]                      # junit, summary, results: out_dir's
    gradebook: MergeReport | None = None
    platform: str = ""                         # a platform's own results file, if asked


def write(result: model.GradeResult, out_dir: str, *, gradebook: str = "", source: str = "",
          platform: Platform | None = None, platform_results: str = "") -> Written:
    """Write a result out: results.json, junit.xml and summary.txt in out_dir
    (results.json last: its presence means done), then its row in `gradebook`
    (source: the path graded, which the instructor's gradebook names), then,
    when grading in a platform's container, the platform's own results file
    at platform_results (platform.write_results)."""
    done = Written(files=report.write_all(result, out_dir))
    if gradebook:
        done.gradebook = update_gradebook(gradebook,
                                                 [(result, done.files["results"], source)])
    if platform is not None and platform_results and platform.write_results(result,
                                                                           platform_results):
        done.platform = platform_results
    return done
