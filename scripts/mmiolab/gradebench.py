"""Where the CPU of one grade goes, phase by phase (make bench-grade; issue 35).

measure() grades a lab's reference solution once, as scripts/grade does
(grade.grade_one: prepare, the visible and the hidden tests' guests, score,
write), in this process, and charges the CPU used meanwhile to the phase
that was running. The CPU is getrusage's: RUSAGE_SELF (this process, all
its threads: the grader and its threads reading QEMU) and RUSAGE_CHILDREN
(children once reaped: the bounded intake and readers, the confined build,
objdump, QEMU; a confined build's pid 1 is adopted to be counted:
subreaper). The phases are the grader's own functions (PHASES), wrapped
by the benchmark for as long as it runs, so the grader itself has no hook
and prints what it always does. A phase run inside another is charged to
the inner one, and the time between phases to a row of its own, so the
rows add up to the total measured around grade_one.

A guest's QEMU is split further:
- its boot: QEMU's CPU (/proc/PID/stat) when its console says the harness
  started ("mmiolab: running:", vm._ConsoleReader.boot), sampled by a
  watcher thread (BootWatch) every POLL seconds; the watcher's own CPU is a
  row too, the benchmark's, not the grader's;
- the rest, harness start to QEMU's exit, shown once more as guest user and
  guest kernel time in the proportion the guest's own clock counted them
  (the harness library's '# mmiolab guest cpu:' line: /proc/stat when the
  harness started and ended, vm/harness-lib.sh). Under TCG the guest's
  clock is the host's wall clock, so a vCPU thread waiting for a host CPU
  still counts ticks: the guest's figures give the proportion, QEMU's CPU
  the amount.

The fabric's waits are not a row: its debugfs files count reads, mmiowb()s
and stalls, not the time spent waiting for them.

With trace_share, the visible guest runs a second time with recording off
(traced() in the harness only checks, vm/record is not called): what the
recording costs. That run is an experiment, not part of the grade: its rows
are printed apart and left out of the total.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import re
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import (MmiolabError, grade, guestout, lab, model, objcheck, sandbox, speed, stages,
               submission, vm)
from .config import Config
from .labspec import LabSpec

#: The watcher's sampling interval, seconds (QEMU's CPU at the harness start
#: is off by at most about this much wall time of QEMU's threads).
POLL = 0.02
#: The harness library's line with the guest's /proc/stat (vm/harness-lib.sh).
GUEST_CPU = "# mmiolab guest cpu: "
#: The guest kernel's USER_HZ: /proc/stat counts in these ticks (x86: 100).
USER_HZ = 100
#: Where the time between the wrapped phases goes.
BETWEEN = "grader, between the phases"
WATCHER = "the benchmark's watcher of QEMU (not the grader's)"
#: The context of the trace-share experiment's guest.
UNTRACED = "untraced visible guest"


class BenchError(MmiolabError):
    """The benchmark cannot measure (a wrapped function is gone, bad figures)."""


# ---------------------------------------------------------------------------- the table

@dataclass
class Row:
    """One phase: CPU seconds of this process (own) and of its reaped children,
    and wall seconds where a phase has its own. A detail row splits the row
    above it (guest user and kernel time) and is not counted in the sums."""
    phase: str
    own: float = 0.0
    children: float = 0.0
    wall: float | None = None
    detail: bool = False
    note: str = ""

    @property
    def cpu(self) -> float:
        return self.own + self.children


@dataclass
class Table:
    """One lab's grade: its rows, the totals measured around grade_one (less
    any experiment), and the experiment's rows, apart."""
    lab: str
    solution: str
    rows: list[Row] = field(default_factory=list)
    own: float = 0.0               # measured: this process, CPU seconds
    children: float = 0.0          # measured: reaped children (QEMU among them)
    wall: float = 0.0              # measured: wall seconds
    qemu: float = 0.0              # of children: the QEMU processes
    boots: int = 0
    verdict: str = ""              # what the grade said (score, verdict)
    extra: list[Row] = field(default_factory=list)   # not part of the grade
    notes: list[str] = field(default_factory=list)

    @property
    def cpu(self) -> float:
        return self.own + self.children

    def summed(self) -> Row:
        """The rows added up (detail rows aside)."""
        out = Row("sum of the rows", wall=0.0)
        for r in self.rows:
            if r.detail:
                continue
            out.own += r.own
            out.children += r.children
        return out

    def check(self, tolerance: float = 0.01) -> None:
        """The rows must add up to the measured total, and each detail split to
        the row it splits; BenchError says where not."""
        s = self.summed()
        if abs(s.cpu - self.cpu) > tolerance:
            raise BenchError(f"{self.lab}: the rows add up to {s.cpu:.3f} CPU-s, the "
                             f"measured total is {self.cpu:.3f}")
        parent: Row | None = None
        parts = 0.0
        for r in self.rows + [Row("")]:
            if r.detail:
                parts += r.cpu
                continue
            if parent is not None and parts and abs(parts - parent.cpu) > tolerance:
                raise BenchError(f"{self.lab}: the details of {parent.phase!r} add up to "
                                 f"{parts:.3f} CPU-s, not {parent.cpu:.3f}")
            parent, parts = r, 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Table:
        try:
            t = cls(**{k: v for k, v in d.items() if k not in ("rows", "extra")})
            t.rows = [Row(**r) for r in d.get("rows", [])]
            t.extra = [Row(**r) for r in d.get("extra", [])]
        except TypeError as e:
            raise BenchError(f"not a bench-grade table: {e}") from None
        return t


def render(t: Table) -> str:
    """The table as text: a row per phase, CPU of the grader's process, of its
    children and both, wall; the sum of the rows and the measured total."""
    w = max([len(r.phase) + (2 if r.detail else 0) for r in t.rows + t.extra] + [36])
    head = f"  {'phase':{w}} {'own':>7} {'child':>7} {'CPU-s':>7} {'wall-s':>7}"
    lines = [f"bench-grade: lab {t.lab}, solution {t.solution}: {t.verdict}", head]

    def line(r: Row) -> str:
        name = ("  " + r.phase) if r.detail else r.phase
        wall = f"{r.wall:7.1f}" if r.wall is not None else f"{'':7}"
        own = f"{'':7}" if r.detail else f"{r.own:7.2f}"
        return (f"  {name:{w}} {own} {r.children:7.2f} {r.cpu:7.2f} {wall}"
                + (f"  {r.note}" if r.note else "")).rstrip()

    lines += [line(r) for r in t.rows]
    s = t.summed()
    rule = "  " + "-" * (w + 32)
    lines += [rule, f"  {'sum of the rows':{w}} {s.own:7.2f} {s.children:7.2f} {s.cpu:7.2f}",
              f"  {'measured (getrusage, wall clock)':{w}} {t.own:7.2f} {t.children:7.2f} "
              f"{t.cpu:7.2f} {t.wall:7.1f}",
              f"  of the children, QEMU ({t.boots} boot{'s' if t.boots != 1 else ''}): "
              f"{t.qemu:.2f} CPU-s; CPU / wall = {t.cpu / t.wall if t.wall else 0:.2f}"]
    if t.extra:
        lines.append("  not part of the grade (an experiment, left out of the total):")
        lines += [line(r) for r in t.extra]
    lines += [f"  {n}" for n in t.notes]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the guest's clock

@dataclass
class GuestCpu:
    """Guest seconds, all its CPUs together, between the harness's start and end."""
    user: float                 # user + nice
    kernel: float               # system + irq + softirq + steal
    idle: float                 # idle + iowait

    @property
    def busy(self) -> float:
        return self.user + self.kernel


_TICKS = re.compile(r"start cpu\s+([\d ]+?)\s*; end cpu\s+([\d ]+?)\s*$")


def guest_cpu(channel: str, nonce: str) -> GuestCpu | None:
    """The guest's CPU time from the harness library's line on the channel
    (the last one tagged with the run's nonce); None if there is none (a
    guest that died, a harness that never started)."""
    found = None
    for line in channel.splitlines():
        if line.startswith(f"{nonce} {GUEST_CPU}"):
            found = line[len(nonce) + 1 + len(GUEST_CPU):].strip()
    if found is None:
        return None
    m = _TICKS.match(found)
    if not m:
        return None
    a, b = ([int(x) for x in g.split()] for g in m.groups())
    if len(a) < 7 or len(a) != len(b):
        return None
    d = [(y - x) / USER_HZ for x, y in zip(a, b)]
    # user nice system idle iowait irq softirq [steal guest guest_nice]:
    # guest and guest_nice are inside user already.
    return GuestCpu(user=d[0] + d[1], kernel=d[2] + d[5] + d[6] + (d[7] if len(d) > 7 else 0),
                    idle=d[3] + d[4])


def qemu_rows(ctx: str, total: float, own: float, wall: float, boot_cpu: float | None,
              boot_wall: float | None, guest: GuestCpu | None, watcher: float) -> list[Row]:
    """A QEMU run's rows: its CPU (total: reaped, exact) split at the harness
    start (boot_cpu: QEMU's CPU then, boot_wall: seconds from its start),
    the rest split again by the guest's clock (detail rows); the grader's
    threads that read the guest meanwhile (own, less the watcher's CPU)."""
    rows = []
    if boot_cpu is None or boot_wall is None:
        rows.append(Row(f"{ctx}: QEMU, never reached the harness", children=total, wall=wall))
    else:
        boot_cpu = min(boot_cpu, total)
        rest = total - boot_cpu
        rows.append(Row(f"{ctx}: QEMU boot, to the harness start", children=boot_cpu,
                        wall=boot_wall))
        rows.append(Row(f"{ctx}: QEMU, harness start to exit", children=rest,
                        wall=max(0.0, wall - boot_wall)))
        if guest is not None and guest.busy > 0:
            share = guest.user / guest.busy
            rows.append(Row("guest user (by the guest's clock)", children=rest * share,
                            detail=True, note=f"guest clock {guest.user:.1f} s"))
            rows.append(Row("guest kernel (by the guest's clock)", children=rest * (1 - share),
                            detail=True, note=f"guest clock {guest.kernel:.1f} s, idle "
                                              f"{guest.idle:.1f} s"))
    rows.append(Row(f"{ctx}: the grader's threads reading the guest", own=own - watcher))
    rows.append(Row(f"{ctx}: {WATCHER}", own=watcher))
    return rows


# ---------------------------------------------------------------------------- measuring

@dataclass
class _Clock:
    own: float
    children: float
    wall: float


def _now() -> _Clock:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return _Clock(s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime, time.monotonic())


def _proc_cpu(pid: int) -> float | None:
    """A process's CPU seconds so far (utime + stime of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().decode(errors="replace").rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# prctl(2): this process adopts its descendants' orphans.
PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """While measuring, this process is a child subreaper (prctl(2)). A
    confined build's CPU would otherwise be lost to getrusage: bubblewrap's
    outer process reports the command's status and exits while the
    sandbox's pid 1 (which reaped make, and make gcc) is still alive, so
    that pid 1 is reparented, and reaped, elsewhere (scripts/grade under
    /usr/bin/time misses it too). Adopted here, it is reaped by
    reap_sandbox_inits and its CPU counts among this process's children."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise BenchError(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        reap_sandbox_inits()


def reap_sandbox_inits() -> int:
    """Reap this process's zombie children named bwrap (the sandboxes' pid 1,
    adopted: subreaper), and only those: any other child is someone's Popen.
    How many were reaped."""
    me = str(os.getpid())
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        state, ppid = stat.rsplit(")", 1)[-1].split()[:2]
        if ppid == me and state == "Z" and comm == "bwrap":
            try:
                os.waitpid(int(pid), 0)
                n += 1
            except ChildProcessError:
                pass
    return n


class BootWatch:
    """A QEMU run's watcher: the pid (from vm._record), the console reader
    (vm._ConsoleReader), and QEMU's CPU as soon as the reader saw the harness
    start; its own CPU (thread time) for the table."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.reader: Any = None
        self.boot_cpu: float | None = None
        self.own = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.thread_time()
        while not self._stop.wait(POLL):
            r = self.reader
            if self.pid is not None and r is not None and r.boot is not None:
                self.boot_cpu = _proc_cpu(self.pid)
                break
        self.own = time.thread_time() - t0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Ledger:
    """CPU and wall charged to the phase on top of a stack."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.stack = [BETWEEN]
        self.last = _now()
        self.context = ""               # the guest being run: "visible guest"...
        self.extra: set[str] = set()    # rows of an experiment, not of the grade
        self.experiment = False

    def _charge(self) -> None:
        now = _now()
        r = self.rows.setdefault(self.stack[-1], Row(self.stack[-1], wall=0.0))
        r.own += now.own - self.last.own
        r.children += now.children - self.last.children
        r.wall = (r.wall or 0.0) + now.wall - self.last.wall
        self.last = now

    def name(self, phase: str) -> str:
        return f"{self.context}: {phase}" if self.context else phase

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Row]:
        """Charge what runs inside to `name` (a row made on first use)."""
        self._charge()
        self.stack.append(name)
        if self.experiment:
            self.extra.add(name)
        try:
            yield self.rows.setdefault(name, Row(name, wall=0.0))
        finally:
            self._charge()
            self.stack.pop()

    def add(self, rows: list[Row]) -> None:
        """Rows made outside the stack (a QEMU run's split): added to the row of
        the same name, a detail row always a row of its own (after its parent)."""
        for r in rows:
            key = r.phase
            old = self.rows.get(key)
            if old is not None and r.detail:
                key = f"{r.phase} ({len(self.rows)})"
                old = None
            if self.experiment:
                self.extra.add(key)
            if old is None:
                self.rows[key] = r
                continue
            old.own += r.own
            old.children += r.children
            if r.wall is not None:
                old.wall = (old.wall or 0.0) + r.wall


#: The grader's functions charged as phases: (module, attribute, row name);
#: a row name with {ctx} is per guest. Each is looked up where its caller
#: finds it (stages calls build_driver by its own name, submission's
#: functions through the module).
PHASES: list[tuple[Any, str, str]] = [
    (grade, "grading_key", "grading key (the kit's and the submission's digests)"),
    (submission, "intake_for_lab", "intake (bounded child)"),
    (stages, "kernel_macros_file", "review: the kernel's macros (cached)"),
    (objcheck, "check_text", "source flags and review (bounded child)"),
    (stages, "build_driver", "module build (confined: sandbox, make, gcc)"),
    (objcheck, "check_elf", "object checks: ELF imports"),
    (stages, "disassemble", "object checks: objdump (confined)"),
    (objcheck, "parse_objdump", "object checks: code"),
    (objcheck, "check_code", "object checks: code"),
    (lab, "guest_programs", "{ctx}: guest test programs (cached)"),
    (vm, "_overlaid", "{ctx}: initramfs overlay"),
    (vm, "run", "{ctx}: QEMU command, accelerator, log folder"),
    (guestout, "read_bounded", "reading the guests' output (bounded child: KTAP, picture)"),
    (stages, "score", "score"),
    (stages, "write", "write results.json, junit.xml, summary.txt"),
]


@contextlib.contextmanager
def _patched(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    saved = []
    try:
        for mod, attr, new in patches:
            if not hasattr(mod, attr):
                raise BenchError(f"the benchmark wraps {mod.__name__}.{attr}, which is gone: "
                                 f"update gradebench.PHASES")
            saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, new)
        yield
    finally:
        for mod, attr, old in reversed(saved):
            setattr(mod, attr, old)


def _wrap(ledger: Ledger, fn: Callable[..., Any], row: str) -> Callable[..., Any]:
    def wrapped(*a: Any, **kw: Any) -> Any:
        with ledger.phase(row.replace("{ctx}", ledger.context or "guest")):
            return fn(*a, **kw)
    return wrapped


def untraced_harness(harness: str, out: str) -> str:
    """A copy of a lab's harness whose traced() only checks (no vm/record): the
    trace-share experiment's. The line goes right after the library's."""
    with open(harness) as f:
        lines = f.read().splitlines(keepends=True)
    at = next((i for i, ln in enumerate(lines) if ln.startswith(". /lib/mmiolab/")), None)
    if at is None:
        raise BenchError(f"{harness} does not source the harness library")
    lines.insert(at + 1, 'traced() { check "$@"; }  # bench-grade: no recording\n')
    with open(out, "w") as f:
        f.write("".join(lines))
    return out


@dataclass
class QemuRun:
    """One QEMU run as measured: its context, CPU (reaped: exact), the grader's
    threads' CPU meanwhile (own, the watcher's included), wall, and QEMU's CPU
    and wall at the harness start."""
    ctx: str
    children: float
    own: float
    wall: float
    boot_cpu: float | None
    watcher: float
    result: vm.RunResult


def measure(spec: LabSpec, solution: str, out: str, cfg: Config,
            trace_share: bool = False, patience: float = 1.0) -> Table:
    """Grade `solution` of `spec` once into `out`, as scripts/grade does, and
    return its table (Table.check holds). patience multiplies the guests'
    time limits (speed.slowdown's factor): on a host loaded by others a
    correct run may reach its ceiling ("too slow", not charged) and measure
    only part of a grade; the CPU a run needs does not depend on it."""
    ledger = Ledger()
    runs: list[QemuRun] = []
    watch: list[BootWatch] = []
    real_run_qemu, real_record, real_reader = vm._run_qemu, vm._record, vm._ConsoleReader
    real_run_guest, real_sandbox_run = stages.run_guest, sandbox.run

    def run_qemu(cfg_: Any, accel: str, initrd: str, append: list[str],
                 log_dir: str) -> vm.RunResult:
        w = BootWatch()
        watch.append(w)
        name = f"QEMU run {len(runs) + 1}"
        try:
            with ledger.phase(name):
                res = real_run_qemu(cfg_, accel, initrd, append, log_dir)
        finally:
            w.stop()
            watch.remove(w)
        row = ledger.rows.pop(name)          # split below, in run_guest
        runs.append(QemuRun(ledger.context, row.children, row.own, row.wall or 0.0,
                            w.boot_cpu, w.own, res))
        return res

    def record(build: str, proc: Any, cmd: list[str], files: list[str]) -> str:
        if watch:
            watch[-1].pid = proc.pid
        return real_record(build, proc, cmd, files)

    class Reader(real_reader):       # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            if watch:
                watch[-1].reader = self

    def guest(spec_: LabSpec, ko: str, seeds: list[int], log_dir: str, ctx: str,
              hidden: bool, kw: dict[str, Any]) -> lab.Run:
        before, ledger.context = ledger.context, ctx
        first = len(runs)
        try:
            with ledger.phase(ledger.name("guest files and options")):
                ran = real_run_guest(spec_, ko, seeds, log_dir, hidden=hidden, **kw)
        finally:
            ledger.context = before
        for q in runs[first:]:
            g = guest_cpu(ran.result.channel, ran.nonce) if q.result is ran.result else None
            ledger.add(qemu_rows(q.ctx, q.children, q.own, q.wall, q.boot_cpu,
                                 q.result.boot_seconds, g, q.watcher))
        return ran

    def run_guest(spec_: LabSpec, ko: str, seeds: list[int], log_dir: str, *,
                  hidden: bool = False, **kw: Any) -> lab.Run:
        ran = guest(spec_, ko, seeds, log_dir, "hidden guest" if hidden else "visible guest",
                    hidden, kw)
        if trace_share and not hidden:
            # The experiment: the visible guest again, recording nothing
            # (run_guest passes no harness for the visible tests: the lab's).
            with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
                harness = untraced_harness(spec_.harness, os.path.join(tmp, "harness.sh"))
                real_run_tests = getattr(stages, "run_tests")   # lab's, as stages calls it

                def run_tests(*a: Any, **kw_: Any) -> lab.Run:
                    ran: lab.Run = real_run_tests(*a, **{**kw_, "harness": harness})
                    return ran
                ledger.experiment = True
                try:
                    with _patched([(stages, "run_tests", run_tests)]):
                        guest(spec_, ko, seeds, log_dir + "-untraced", UNTRACED, False, kw)
                finally:
                    ledger.experiment = False
        return ran

    def sandbox_run(*a: Any, **kw: Any) -> sandbox.Result:
        res = real_sandbox_run(*a, **kw)
        reap_sandbox_inits()
        return res

    missing = [f"{m.__name__}.{a}" for m, a, _ in PHASES if not hasattr(m, a)]
    if missing:
        raise BenchError(f"the benchmark wraps {', '.join(missing)}, which the grader no "
                         f"longer has: update gradebench.PHASES")
    patches: list[tuple[Any, str, Any]] = [
        (mod, attr, _wrap(ledger, getattr(mod, attr), row)) for mod, attr, row in PHASES]
    real_slowdown = speed.slowdown

    def slowdown(*a: Any, **kw: Any) -> float:
        return float(real_slowdown(*a, **kw)) * patience

    if patience != 1.0:
        patches.append((speed, "slowdown", slowdown))
    patches += [(vm, "_run_qemu", run_qemu), (vm, "_record", record),
                (vm, "_ConsoleReader", Reader), (stages, "run_guest", run_guest),
                (sandbox, "run", sandbox_run)]
    opts = grade.GradeOptions(seeds=list(spec.default_seeds), out=out, cfg=cfg)
    path = spec.solution_source(solution, cfg)
    with _patched(patches), subreaper():
        t0 = ledger.last = _now()
        result = grade.grade_one(spec, path, f"solution-{solution}", opts)
        ledger._charge()
        t1 = ledger.last
    table = Table(lab=spec.name, solution=solution,
                  qemu=sum(q.children for q in runs if q.ctx != UNTRACED),
                  boots=sum(q.ctx != UNTRACED for q in runs),
                  verdict=f"{result.score:g}/{result.max_score:g}, {result.verdict}")
    for key, r in ledger.rows.items():
        (table.extra if key in ledger.extra else table.rows).append(r)
    table.own = t1.own - t0.own - sum(r.own for r in table.extra if not r.detail)
    table.children = t1.children - t0.children - sum(
        r.children for r in table.extra if not r.detail)
    table.wall = t1.wall - t0.wall - sum(r.wall or 0.0 for r in table.extra if not r.detail)
    _notes(table)
    # The grader's own timings (instructor.json), for comparison: wall seconds.
    table.notes.append(f"the grader's own record (instructor.json): {result.execution_time:.1f} s, "
                       f"the hidden tests' guest {result.hidden_seconds:.1f} s"
                       + (" (the experiment's guest included)" if trace_share else ""))
    table.check()
    return table


def _notes(t: Table) -> None:
    """What a reader of the table should know besides: recording's share
    (with the experiment), the guests' share."""
    def qcpu(rows: list[Row], ctx: str) -> float:
        return sum(r.children for r in rows if r.phase.startswith(ctx + ": QEMU, harness"))
    traced = qcpu(t.rows, "visible guest")
    untraced = qcpu(t.extra, UNTRACED)
    if t.extra and untraced:
        t.notes.append(f"trace recording (the visible guest's race runs under vm/record, "
                       f"nothing sent): {traced - untraced:+.2f} CPU-s of QEMU after the "
                       f"harness start ({traced:.2f} traced, {untraced:.2f} not), "
                       f"{(traced - untraced) / t.cpu * 100 if t.cpu else 0:.0f}% of the grade")
    boot = sum(r.children for r in t.rows if r.phase.endswith("QEMU boot, to the harness start"))
    failed = [r for r in t.rows if r.phase.endswith("QEMU, never reached the harness")]
    if failed:
        t.notes.append(f"a guest that went down before its harness started (lab.run_tests "
                       f"boots it again): {sum(r.children for r in failed):.2f} CPU-s, "
                       f"{sum(r.wall or 0.0 for r in failed):.1f} s")
    if t.cpu:
        t.notes.append(f"guest boots: {boot:.2f} CPU-s ({boot / t.cpu * 100:.0f}%); all QEMU: "
                       f"{t.qemu:.2f} ({t.qemu / t.cpu * 100:.0f}%); the rest of the grade "
                       f"{t.cpu - t.qemu:.2f}")


def save(tables: list[Table], path: str, about: dict[str, Any]) -> None:
    """The figures as JSON (the next step's 'before'): about (machine, command), tables."""
    model.atomic_write(path, json.dumps({**about, "tables": [t.to_dict() for t in tables]},
                                        indent=1) + "\n")


def load(path: str) -> list[Table]:
    try:
        with open(path) as f:
            d = json.load(f)
        return [Table.from_dict(t) for t in d["tables"]]
    except (OSError, ValueError, KeyError, TypeError, BenchError) as e:
        raise BenchError(f"{path}: not bench-grade figures ({e})") from None
