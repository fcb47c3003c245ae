"""Timelines of recorded runs: parse ftrace output of the lab kernel's mmiosim
trace events, find the first stale doorbell or late interrupt, draw it.

One implementation for every picture of a run: the docs' figures
(Documentation/sphinx/tracefig.py), the instructor's recordings
(scripts/trace-timeline), the student's own runs in the lab VM (the guest's
``record`` helper, then ``scripts/kit timeline``) and, later, the grader's
reports. Standard library only.

The events (include/trace/events/mmiosim.h of the patched tree), as
/sys/kernel/tracing/trace prints them::

    ringtest-55 [001] d.... 1.280073: mmiosim_post: win=0 cpu=1 seq=6 off=0x1c val=0x6 t=1280075153
    <idle>-0    [000] d.h.. 1.280079: mmiosim_drain: cpu=1 seq=6 t=1280075153 overtaken
    <idle>-0    [000] d.h.. 1.280080: mmiosim_arrive: win=0 cpu=1 seq=6 off=0x1c val=0x6 t=1280076170
    ringtest-54 [000] ..... 1.280090: mmiosim_mmiowb: cpu=0 wait=4210
    ringtest-54 [000] ..... 1.280120: mmiosim_read: win=0 cpu=0 off=0x20 val=0x6 cost=23100

t= is the fabric's clock (the kernel's monotonic clock) in ns: for post, the
time the write will leave its CPU's queue; for drain, the time it entered
the bridge; for arrive, the time the device got it. The line's own
timestamp (seconds, microsecond resolution) is when the event was recorded;
with trace_clock "mono" it is on the same clock as t=, which gives the time
a write was posted, and the end of a read or an mmiowb() (their start is
that minus cost= or wait=).

Two of the kernel's own events complete the picture of an interrupt that
comes too late: ``irq:irq_handler_entry`` (``irq=25 name=postdrv``: a
handler starts, on the CPU of the line) and ``raw_syscalls:sys_exit``
(``NR 16 = 0``: a task's system call returns to user space). Other events
are ignored. The card's register names (labels, the doorbell, INT_ENABLE)
are read from the kernel's include/linux/mmiosim_ring.h (ring()).

A recorded file may start with "# key: value" header lines (written by the
guest's ``record`` helper and by scripts/trace-timeline): ``fabric`` (the
line of /sys/kernel/debug/mmiosim/params), ``card_irq`` (the card's
interrupt number), ``trace_clock`` and others. ftrace's own "#" lines are
read for one thing: whether the buffer overflowed.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import html
import os
import re
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass, field

from . import MmiolabError

# Applied to a line with its leading blanks removed ('^\s*(?P<task>.*?)' backtracks
# quadratically on a line of blanks), and never to a line over MAX_LINE.
LINE_RE = re.compile(
    r"^(?P<task>.*?)-(?P<pid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[(?P<tcpu>\d+)\]\s+"
    r"(?:(?P<flags>[^\s:]{4,6})\s+)?(?P<ts>\d+\.\d+):\s+(?P<event>\w+):\s*(?P<rest>.*)$")
#: The longest trace line read (ftrace's are under 200 characters); longer ones
#: are skipped. A recording is inflated to at most MAX_RECORDING bytes.
MAX_LINE = 4096
MAX_RECORDING = 16 << 20
HEADER_RE = re.compile(r"^#\s*(?P<key>[a-z_]+):\s*(?P<value>.*)$")
ENTRIES_RE = re.compile(r"^#\s*entries-in-buffer/entries-written:\s*(\d+)/(\d+)")
LOST_RE = re.compile(r"^CPU:(\d+) \[LOST (\d+) EVENTS\]")
SYS_EXIT_RE = re.compile(r"NR (-?\d+) = (-?\d+)")

# The ring card's register map is the kernel header's, read at run time (ring()).
RING_HEADER = os.path.join("include", "linux", "mmiosim_ring.h")
_DEFINE = re.compile(r"^#define[ \t]+MMIOSIM_RING_([A-Z0-9_]+)[ \t]+(0x[0-9a-fA-F]+|[0-9]+)\b")
# x86_64 system call numbers worth a name on the picture.
SYSCALLS = {0: "read", 1: "write", 16: "ioctl"}
EVENTS = ("mmiosim_post", "mmiosim_drain", "mmiosim_arrive", "mmiosim_read", "mmiosim_mmiowb",
          "irq_handler_entry", "sys_exit")


class TraceError(MmiolabError, ValueError):
    """The trace cannot be drawn; the message says why."""


@dataclass(frozen=True)
class Ring:
    """The ring card's registers: offset -> name (without MMIOSIM_RING_)."""
    regs: dict

    def offset(self, name: str) -> int:
        return next(off for off, n in self.regs.items() if n == name)

    @property
    def doorbell(self) -> int:
        return self.offset("DOORBELL")

    @property
    def int_enable(self) -> int:
        return self.offset("INT_ENABLE")

    def name(self, off: int) -> str:
        return self.regs.get(off, hex(off))


def parse_ring_header(text: str, where: str = RING_HEADER) -> Ring:
    """The registers of mmiosim_ring.h: its MMIOSIM_RING_* defines whose value is
    written as two hex digits, is 4-byte aligned and lies inside MMIOSIM_RING_WINDOW
    (the flags, the ID value and the ring size are none of these)."""
    defs = {}
    for line in text.splitlines():
        m = _DEFINE.match(line)
        if m:
            defs[m.group(1)] = m.group(2)
    window = int(defs.get("WINDOW", "0"), 0)
    regs = {int(v, 16): name for name, v in defs.items()
            if re.fullmatch(r"0x[0-9a-fA-F]{2}", v) and int(v, 16) % 4 == 0
            and int(v, 16) < window}
    missing = [n for n in ("DOORBELL", "INT_ENABLE") if n not in regs.values()]
    if not window or missing:
        raise TraceError(f"{where} is not the ring card's register map (no "
                         + ", ".join(["MMIOSIM_RING_WINDOW"] * (not window)
                                     + [f"MMIOSIM_RING_{n}" for n in missing]) + ")")
    return Ring(regs)


@functools.lru_cache(maxsize=None)
def ring() -> Ring:
    """The ring card's registers, from include/linux/mmiosim_ring.h of the lab
    kernel tree (a handout's prebuilt tree carries it); a TraceError says where
    it looked."""
    from . import kernel
    path = os.path.join(kernel.tree().src, RING_HEADER)
    try:
        with open(path, encoding="utf-8") as f:
            return parse_ring_header(f.read(), path)
    except OSError:
        raise TraceError(f"the ring card's register names are read from {path}, which "
                         "is missing: run 'make kernel'") from None


@dataclass
class Event:
    lineno: int             # 1-based line in the file
    task: str
    ts_ns: int              # the line's timestamp, in ns
    name: str               # post, drain, arrive, read, mmiowb, irq_handler_entry, sys_exit
    fields: dict
    flags: set
    pid: int = -1
    cpu: int = -1           # the CPU that recorded the line


@dataclass
class Write:
    seq: int
    cpu: int
    win: int
    off: int
    val: int
    post: int | None = None         # ns: when it was posted (see model())
    post_ts: int | None = None      # ns: the post line's own timestamp
    drain: int | None = None        # ns (t= of the drain event)
    arrive: int | None = None       # ns (t= of the arrive event)
    overtaken: bool = False         # entered the bridge behind a later-posted write
    stale: bool = False             # a doorbell that arrived after a later-posted one
    pid: int = -1                   # the task that posted it
    task: str = ""
    lines: list = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return None not in (self.post, self.drain, self.arrive)

    @property
    def reg(self) -> str:
        return ring().name(self.off)


@dataclass
class Span:
    kind: str               # "mmiowb" or "read"
    cpu: int
    start: int
    end: int
    detail: str
    lineno: int


@dataclass
class Irq:
    """An interrupt handler started (irq:irq_handler_entry)."""
    cpu: int
    ts: int
    irq: int
    name: str
    lineno: int
    late: bool = False      # the card's, after the call that disabled it had returned


@dataclass
class Return:
    """A system call returned to user space (raw_syscalls:sys_exit)."""
    cpu: int
    ts: int
    pid: int
    task: str
    nr: int
    ret: int
    lineno: int
    disabled: Write | None = None   # the interrupt-disable write this call posted

    @property
    def call(self) -> str:
        return f"{SYSCALLS[self.nr]}()" if self.nr in SYSCALLS else f"system call {self.nr}"


@dataclass
class Trace:
    header: dict
    events: list
    writes: dict            # seq -> Write
    spans: list             # mmiowb() waits and reads
    irqs: list = field(default_factory=list)
    returns: list = field(default_factory=list)
    lost: int = 0           # events ftrace says it dropped (a buffer that overflowed)

    @property
    def card_irq(self) -> int | None:
        v = self.header.get("card_irq", "")
        return int(v) if v.isdigit() else None


def _num(s: str) -> int:
    return int(s, 0)


def parse(text: str, route_ns: list | None = None) -> Trace:
    """Parse trace text (a whole /sys/kernel/tracing/trace, or an excerpt).

    route_ns: the fabric's route latencies (default: from a "# fabric:"
    header line, else none), used to place each write's post (see model()).
    """
    header, events, overwritten, lost = {}, [], 0, 0
    for n, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE:
            continue
        if line.startswith("#"):
            m = HEADER_RE.match(line)
            if m:
                header.setdefault(m["key"], m["value"].strip())
            m = ENTRIES_RE.match(line)
            if m:
                overwritten = max(0, int(m.group(2)) - int(m.group(1)))
            continue
        m = LOST_RE.match(line)
        if m:
            lost += int(m.group(2))
            continue
        m = LINE_RE.match(line.lstrip())
        if not m or m["event"] not in EVENTS:
            continue
        rest = m["rest"]
        fields = _fields(rest)
        flags = {w for w in rest.split() if "=" not in w}
        sec, frac = m["ts"].split(".")
        ts_ns = int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])
        name = m["event"].removeprefix("mmiosim_")
        if name == "sys_exit":
            sm = SYS_EXIT_RE.search(rest)
            if not sm:
                continue
            fields = {"nr": sm.group(1), "ret": sm.group(2)}
        events.append(Event(n, m["task"].strip(), ts_ns, name, fields, flags, int(m["pid"]),
                            int(m["tcpu"])))
    if route_ns is None:
        route_ns = fabric_routes(header.get("fabric", ""))
    tr = model(header, events, route_ns)
    # The same loss may be told both ways (the header's count, a LOST line).
    tr.lost = max(overwritten, lost)
    return tr


def _fields(rest: str) -> dict:
    """key=value words (key: word characters), in linear time: in each word, the
    first '=' with a key before it and a value after it, as
    re.findall(r"(\\w+)=(\\S+)") finds them, without its quadratic worst case."""
    out = {}
    for word in rest.split():
        start = -1
        for j, ch in enumerate(word):
            if ch == "=":
                if start >= 0 and j + 1 < len(word):
                    out[word[start:j]] = word[j + 1:]
                    break
                start = -1
            elif ch.isalnum() or ch == "_":
                if start < 0:
                    start = j
            else:
                start = -1
    return out


def fabric_routes(params: str) -> list:
    """route_ns from a line of /sys/kernel/debug/mmiosim/params ([] if absent)."""
    m = re.search(r"\broute_ns=([\d,]+)", params)
    return [int(r) for r in m.group(1).split(",") if r] if m else []


def fabric_param(params: str, name: str, default: int = 0) -> int:
    """One numeric parameter from a line of /sys/kernel/debug/mmiosim/params."""
    m = re.search(rf"\b{name}=(\d+)", params)
    return int(m.group(1)) if m else default


def model(header: dict, events: list, route_ns: list | None = None) -> Trace:
    """Writes, reads, mmiowb() waits, interrupts and returns from the events.

    When a write is posted, the fabric first brings its model up to date,
    which may deliver earlier writes to the device and take a while; the
    post event is recorded after that, so its timestamp can be later than
    the moment the write was posted. The post's t= (when the write leaves
    its CPU's queue) is at least that moment plus the CPU's route latency,
    so a write's post time is taken as the earlier of the line's timestamp
    and t= minus the route latency.
    """
    route_ns = route_ns or [0]
    writes: dict[int, Write] = {}
    spans, irqs, returns = [], [], []

    def write_of(ev, f):
        seq = _num(f["seq"])
        w = writes.get(seq)
        if w is None:
            w = writes[seq] = Write(seq, _num(f["cpu"]), _num(f.get("win", "-1")),
                                    _num(f.get("off", "-1")), _num(f.get("val", "0")))
        if "off" in f and w.off < 0:
            w.win, w.off, w.val = _num(f["win"]), _num(f["off"]), _num(f["val"])
        w.lines.append(ev.lineno)
        return w

    for ev in events:
        f = ev.fields
        try:
            if ev.name == "post":
                w = write_of(ev, f)
                w.post_ts = ev.ts_ns
                w.post = min(ev.ts_ns, _num(f["t"]) - route_ns[w.cpu % len(route_ns)])
                w.pid, w.task = ev.pid, ev.task
            elif ev.name == "drain":
                w = write_of(ev, f)
                w.drain = _num(f["t"])
                w.overtaken = "overtaken" in ev.flags
            elif ev.name == "arrive":
                write_of(ev, f).arrive = _num(f["t"])
            elif ev.name == "mmiowb":
                wait = _num(f["wait"])
                spans.append(Span("mmiowb", _num(f["cpu"]), ev.ts_ns - wait, ev.ts_ns,
                                  f"mmiowb() waited {wait} ns", ev.lineno))
            elif ev.name == "read":
                cost = _num(f["cost"])
                off = _num(f["off"])
                spans.append(Span("read", _num(f["cpu"]), ev.ts_ns - cost, ev.ts_ns,
                                  f"readl({ring().name(off)}) took {cost} ns",
                                  ev.lineno))
            elif ev.name == "irq_handler_entry":
                irqs.append(Irq(ev.cpu, ev.ts_ns, _num(f["irq"]), f.get("name", ""), ev.lineno))
            elif ev.name == "sys_exit":
                returns.append(Return(ev.cpu, ev.ts_ns, ev.pid, ev.task, int(f["nr"]),
                                      int(f["ret"]), ev.lineno))
        except (KeyError, ValueError) as e:
            raise TraceError(f"line {ev.lineno}: malformed {ev.name} event ({e})")
    # A doorbell is stale when it arrives after a doorbell posted later.
    newest = {}
    for w in sorted((w for w in writes.values() if w.arrive is not None and w.off == ring().doorbell),
                    key=lambda w: (w.arrive, w.lines[-1])):
        if w.win in newest and w.seq < newest[w.win]:
            w.stale = True
        newest[w.win] = max(newest.get(w.win, -1), w.seq)
    tr = Trace(header, events, writes, spans, irqs, returns)
    _mark_late(tr)
    return tr


def _mark_late(tr: Trace) -> None:
    """Mark the card's interrupts that came after the driver had disabled them.

    A write of 0 to INT_ENABLE disables the card's interrupts; the system
    call in which a task posted it (its next sys_exit) is the driver's
    "stop". An interrupt of the card whose handler starts after that call
    has returned, and before the next write to INT_ENABLE, is late: the
    caller was told the card was quiet. (The posting lab's test counts the
    same interrupts, as the card's line of /proc/interrupts moving after
    STOP returned.)
    """
    irq = tr.card_irq
    if not tr.returns:
        return
    enables = sorted((w for w in tr.writes.values() if w.off == ring().int_enable and w.lines),
                     key=lambda w: min(w.lines))
    for i, d in enumerate(enables):
        if d.val != 0 or d.pid < 0:
            continue
        posted = min(d.lines)
        ret = next((r for r in tr.returns if r.pid == d.pid and r.lineno > posted), None)
        if ret is None:
            continue
        ret.disabled = d
        until = min(enables[i + 1].lines) if i + 1 < len(enables) else float("inf")
        for q in tr.irqs:
            if irq is not None and q.irq == irq and ret.lineno < q.lineno < until:
                q.late = True


# --- what a run shows --------------------------------------------------------


def first_reordering(tr: Trace, off: int | None = None):
    """The first doorbell (off: by default the card's) that arrived stale, and the
    later-posted one it arrived after.

    Returns (old, new) Writes, or None when no doorbell arrived out of order.
    """
    off = ring().doorbell if off is None else off
    arrived = sorted((w for w in tr.writes.values() if w.arrive is not None and w.off == off),
                     key=lambda w: (w.arrive, w.lines[-1]))
    seen: dict[int, list[int]] = {}         # window -> seqs arrived so far, sorted
    for w in arrived:
        seqs = seen.setdefault(w.win, [])
        i = bisect.bisect_right(seqs, w.seq)
        if i < len(seqs):
            return w, tr.writes[seqs[i]]
        bisect.insort(seqs, w.seq)
    return None


def first_late_interrupt(tr: Trace):
    """The first late interrupt of the card: (the disabling write, the return of the
    call that posted it, the interrupt), or None."""
    late = next((q for q in tr.irqs if q.late), None)
    if late is None:
        return None
    ret = max((r for r in tr.returns if r.disabled is not None and r.lineno < late.lineno),
              key=lambda r: r.lineno)
    return ret.disabled, ret, late


def first_early_return(tr: Trace):
    """The first call that posted an interrupt disable and returned before the
    write reached the card (what the posting lab's test asks the card), or None."""
    return next((r for r in sorted(tr.returns, key=lambda r: r.lineno)
                 if r.disabled is not None
                 and (r.disabled.arrive is None or r.disabled.arrive > r.ts)), None)


def first_handoff(tr: Trace, barrier: str = "mmiowb", off: int | None = None):
    """A lock hand-over: a doorbell, then the next doorbell, from another CPU.

    Among such pairs, picks one where the first CPU's barrier (barrier:
    "mmiowb" or "read") ran between the two posts and the second CPU posted
    soonest after that barrier ended, i.e. took the lock right after it was
    released; for "mmiowb", one where the first doorbell was still on its
    way to the device when mmiowb() returned (ordering without arrival).
    Returns (first, second) Writes, or None.
    """
    off = ring().doorbell if off is None else off
    dbs = sorted((w for w in tr.writes.values() if w.complete and w.off == off),
                 key=lambda w: w.seq)
    ends: dict[int, list[int]] = {}         # CPU -> end times of its barriers, sorted
    for s in tr.spans:
        if s.kind == barrier:
            ends.setdefault(s.cpu, []).append(s.end)
    for v in ends.values():
        v.sort()
    best = None
    for a, b in zip(dbs, dbs[1:]):
        if a.cpu == b.cpu or a.win != b.win:
            continue
        cpu_ends = ends.get(a.cpu, [])
        i = bisect.bisect_left(cpu_ends, a.post)
        if i == len(cpu_ends) or cpu_ends[i] > b.post:
            continue
        end = cpu_ends[i]
        if barrier == "mmiowb" and a.arrive <= end:
            continue
        gap = b.post - end
        if best is None or gap < best[0]:
            best = (gap, a, b)
    return (best[1], best[2]) if best else None


def last_crossing(tr: Trace, off: int | None = None):
    """The last two consecutive doorbells posted from different CPUs, or None."""
    off = ring().doorbell if off is None else off
    dbs = sorted((w for w in tr.writes.values() if w.complete and w.off == off),
                 key=lambda w: w.seq)
    pairs = [(a, b) for a, b in zip(dbs, dbs[1:]) if a.cpu != b.cpu and a.win == b.win]
    return pairs[-1] if pairs else None


def _us(ns: int) -> str:
    return f"{ns / 1000:.1f} \u00b5s"


def describe_reordering(old: Write, new: Write) -> str:
    return (f"CPU {old.cpu} wrote doorbell {old.val} (seq={old.seq}); CPU {new.cpu} wrote "
            f"{new.val} (seq={new.seq}) after it, which entered the bridge "
            f"{(old.drain - new.drain) / 1000:.2f} \u00b5s earlier (seq={old.seq} overtaken); "
            f"the card saw {new.val} and then {old.val}: a stale doorbell")


def describe_late(d: Write, ret: Return, q: Irq) -> str:
    when = ("before it arrived" if d.arrive is None or q.ts < d.arrive else
            f"{_us(q.ts - d.arrive)} after it arrived (raised before: the card raises its "
            "interrupt only while it is enabled)")
    return (f"{d.task or 'a task'} on CPU {d.cpu} wrote 0 to INT_ENABLE (seq={d.seq}) and its "
            f"{ret.call} returned {_us(ret.ts - d.post)} later"
            + (f"; the write reached the card {_us(d.arrive - d.post)} after it was posted"
               if d.arrive is not None else "; the write had not reached the card when the "
               "trace ends")
            + f"; the card's interrupt (irq {q.irq}) was handled on CPU {q.cpu} "
            f"{_us(q.ts - ret.ts)} after that return, {when}: a late interrupt")


def describe_early_return(d: Write, ret: Return) -> str:
    return (f"{d.task or 'a task'} on CPU {d.cpu} wrote 0 to INT_ENABLE (seq={d.seq}) and its "
            f"{ret.call} returned {_us(ret.ts - d.post)} later, "
            + (f"{_us(d.arrive - ret.ts)} before the write reached the card"
               if d.arrive is not None else "before the write reached the card (not by the "
               "end of the trace)")
            + ": the card's interrupt was still on when the call returned")


def describe_handoff(tr: Trace, a: Write, b: Write, barrier: str) -> str:
    span = next(sp for sp in tr.spans if sp.kind == barrier and sp.cpu == a.cpu
                and a.post <= sp.end <= b.post)
    if barrier == "mmiowb":
        return (f"CPU {a.cpu} wrote doorbell {a.val} (seq={a.seq}) and waited in mmiowb() "
                f"for {_us(span.end - span.start)}, until the write had entered the bridge; "
                f"CPU {b.cpu} then took the lock and wrote {b.val} (seq={b.seq}), which "
                "entered the bridge behind it"
                + (f", {_us(a.arrive - b.drain)} before {a.val} reached the device: mmiowb() "
                   "ordered the writes without waiting for arrival"
                   if b.drain < a.arrive else ""))
    return (f"CPU {a.cpu} wrote doorbell {a.val} (seq={a.seq}) and read back from the "
            f"card before unlocking; the read took {_us(span.end - span.start)} and "
            f"returned after the write had arrived; CPU {b.cpu} then took the lock and "
            f"wrote {b.val} (seq={b.seq})")


@dataclass
class Finding:
    kind: str               # stale-doorbell | late-interrupt | early-return | mmiowb | read
    #                         | disable | crossing
    text: str               # one sentence: what the excerpt shows
    lines: list             # the excerpt's line numbers in the trace (1-based)

    @property
    def failure(self) -> bool:
        return self.kind in ("stale-doorbell", "late-interrupt", "early-return")


def find(tr: Trace) -> Finding | None:
    """What to show of a run: its first stale doorbell, else its first late
    interrupt, else its first interrupt disable whose call returned before the
    write reached the card (the posting lab's failure), else a moment of the
    driver at work (a lock hand-over with its barrier, the last interrupt
    disable, the last doorbells from two CPUs)."""
    pair = first_reordering(tr)
    if pair:
        return Finding("stale-doorbell", describe_reordering(*pair),
                       excerpt_lines(tr, pair, context_writes=1))
    late = first_late_interrupt(tr)
    if late:
        d, ret, q = late
        return Finding("late-interrupt", describe_late(d, ret, q),
                       excerpt_lines(tr, _with_doorbell_before(tr, d), 0, upto=q.lineno))
    ret = first_early_return(tr)
    if ret:
        d = ret.disabled
        return Finding("early-return", describe_early_return(d, ret),
                       excerpt_lines(tr, _with_doorbell_before(tr, d), 0,
                                     upto=ret.lineno))
    for barrier in ("mmiowb", "read"):
        pair = first_handoff(tr, barrier)
        if pair:
            return Finding(barrier, describe_handoff(tr, *pair, barrier),
                           excerpt_lines(tr, pair, context_writes=0))
    ret = max((r for r in tr.returns if r.disabled is not None), key=lambda r: r.lineno,
              default=None)
    if ret is not None:
        d = ret.disabled
        return Finding("disable",
                       f"{d.task or 'a task'} on CPU {d.cpu} wrote 0 to INT_ENABLE (seq={d.seq})"
                       + (f"; it reached the card {_us(d.arrive - d.post)} later" if d.complete
                          else "") + f", and its {ret.call} returned "
                       f"{_us(ret.ts - d.post)} after the write was posted; no interrupt of "
                       "the card came after that return",
                       excerpt_lines(tr, _with_doorbell_before(tr, d), 0, upto=ret.lineno))
    pair = last_crossing(tr)
    if pair:
        a, b = pair
        return Finding("crossing", f"CPU {a.cpu} wrote doorbell {a.val} (seq={a.seq}), then CPU "
                       f"{b.cpu} wrote {b.val} (seq={b.seq}); they reached the card in order",
                       excerpt_lines(tr, pair, context_writes=0))
    return None


def _with_doorbell_before(tr: Trace, w: Write) -> list:
    """w and the last doorbell posted before it (the commands still in flight)."""
    db = ring().doorbell
    before = [o for o in tr.writes.values() if o.off == db and o.seq < w.seq and o.lines]
    return [max(before, key=lambda o: o.seq), w] if before else [w]


def excerpt_lines(tr: Trace, pair, context_writes: int = 1, max_lines: int = 300,
                  upto: int = 0):
    """The line numbers (1-based, sorted) of an excerpt around writes.

    From the earliest post of `pair` (one or more Writes; and the posts of
    context_writes writes to the same register before it) to the latest of
    their arrivals and line `upto`, extended so that every write posted in
    between is complete; at most max_lines lines.
    """
    start = min(min(w.lines) for w in pair)
    end = max([max(w.lines) for w in pair] + [upto])
    first = min(w.seq for w in pair)
    earlier = sorted((w for w in tr.writes.values() if w.off == pair[0].off and w.seq < first
                      and w.lines), key=lambda w: w.seq)[-context_writes:] if context_writes else []
    for w in earlier:
        start = min(start, min(w.lines))
        end = max(end, max(w.lines))
    for _ in range(5):
        grown = end
        for w in tr.writes.values():
            if w.lines and start <= min(w.lines) <= end:
                grown = max(grown, max(w.lines))
        if grown == end:
            break
        end = grown
    lines = [ev.lineno for ev in tr.events if start <= ev.lineno <= end]
    if len(lines) > max_lines:
        # A long-stalled write spans many others: keep these writes whole,
        # and of the rest the events (whole writes) nearest their last line.
        lines = _thinned(tr, list(pair) + list(earlier), max(end, upto), lines, max_lines)
    if len(lines) > max_lines:
        raise TraceError(f"the excerpt would have {len(lines)} events (more than {max_lines})")
    return lines


def _thinned(tr: Trace, keep, centre: int, lines: list, max_lines: int) -> list:
    """At most max_lines of lines: all those of the writes in keep, then, nearest
    centre first, other events, a write only with all its lines."""
    window = set(lines)
    owner = {ln: w for w in tr.writes.values() for ln in w.lines}
    chosen = {ln for w in keep for ln in w.lines}
    for ln in sorted(window - chosen, key=lambda n: abs(n - centre)):
        if len(chosen) >= max_lines:
            break
        w = owner.get(ln)
        group = set(w.lines) if w else {ln}
        if group <= window and len(chosen | group) <= max_lines:
            chosen |= group
    return sorted(chosen)


# --- the whole job: a recorded trace in, a picture and an excerpt out --------


@dataclass
class Drawing:
    svg: str                # the timeline of the excerpt ("" if nothing could be drawn)
    excerpt: str            # the excerpt as text: header lines, then the trace lines
    finding: Finding | None
    summary: str            # one line: what the whole trace holds
    warnings: list


def summarize(tr: Trace) -> str:
    dbs = [w for w in tr.writes.values() if w.off == ring().doorbell]
    card = [q for q in tr.irqs if q.irq == tr.card_irq]
    parts = [f"{len(tr.writes)} writes ({len(dbs)} doorbells)",
             f"{sum(w.stale for w in dbs)} stale doorbells",
             f"{sum(w.overtaken for w in tr.writes.values())} overtaken in the bridge",
             # the fabric traces an mmiowb() only when its CPU's queue was not empty
             f"{sum(s.kind == 'mmiowb' for s in tr.spans)} mmiowb() that waited",
             f"{sum(s.kind == 'read' for s in tr.spans)} reads"]
    if tr.card_irq is not None:
        parts.append(f"{len(card)} interrupts of the card ({sum(q.late for q in card)} late)")
    return ", ".join(parts)


def draw(text: str, title: str = "", width: int = 960, ident: str = "tl",
         header: dict | None = None) -> Drawing:
    """Find what a recorded trace shows, cut an excerpt around it and draw it.

    header: extra "# key: value" lines for the excerpt (after the trace's own).
    """
    tr = parse(text)
    warnings = []
    if tr.lost:
        warnings.append(f"the trace buffer was full: its {tr.lost} oldest events were "
                        "overwritten, so the trace holds the end of the run only (in the lab "
                        "VM, RECORD_KB=4096 record ... keeps four times as much)")
    if tr.header.get("trace_clock", "mono") != "mono":
        warnings.append(f"trace_clock is {tr.header['trace_clock']!r}, not 'mono': the line "
                        "timestamps are not on the fabric's clock")
    try:
        finding = find(tr)
    except TraceError as e:
        finding = None
        warnings.append(f"no excerpt: {e}")
    summary = summarize(tr)
    lines = text.splitlines()
    # "# output:" lines (the recorded command's output) are many: kept apart.
    head = {k: v for k, v in tr.header.items() if k not in ("shows", "excerpt", "output")}
    head.update(header or {})
    outputs = [ln for ln in lines[:2000] if ln.startswith("# output: ")][:200]
    if finding is None:
        head["shows"] = "no complete write of the card in this trace"
        excerpt = "\n".join([f"# {k}: {v}" for k, v in head.items()] + outputs) + "\n"
        return Drawing("", excerpt, None, summary, warnings)
    head["shows"] = finding.text
    head["summary"] = summary
    keep = finding.lines
    head["excerpt"] = f"lines {keep[0]}-{keep[-1]} of {len(lines)} ({len(keep)} events)"
    left_out = sum(keep[0] <= ev.lineno <= keep[-1] for ev in tr.events) - len(keep)
    if left_out:
        head["excerpt"] += (f"; {left_out} events in between left out (the writes farthest "
                            "from what it shows)")
    columns = [ln for ln in lines[:2500] if ln.startswith("#") and "TASK-PID" in ln]
    excerpt = "\n".join([f"# {k}: {v}" for k, v in head.items()] + outputs + columns[-1:]
                        + [lines[i - 1] for i in keep]) + "\n"
    try:
        svg = render_svg(parse(excerpt), title=title, width=width, ident=ident)
    except TraceError as e:
        svg = ""
        warnings.append(f"the excerpt cannot be drawn: {e}")
    return Drawing(svg, excerpt, finding, summary, warnings)


def html_page(d: Drawing, title: str) -> str:
    """A page for the browser: the picture, what it shows, and the excerpt."""
    warn = "".join(f"<p class='warn'>Warning: {_e(w)}</p>" for w in d.warnings)
    shows = d.finding.text if d.finding else "nothing to draw"
    bad = d.finding is not None and d.finding.failure
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>"
            "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:1.5em;color:#222;max-width:1000px}"
            "pre{font-size:11px;background:#f6f6f6;padding:.8em;overflow-x:auto}"
            ".shows{font-size:15px}.bad{color:#b00020}.warn{color:#b35900}"
            "</style></head><body>"
            f"<h1>{_e(title)}</h1>"
            f"<p class='shows{' bad' if bad else ''}'><b>{'Found' if bad else 'Shows'}:</b> "
            f"{_e(shows)}.</p><p>{_e(d.summary)}.</p>{warn}{d.svg}"
            f"<h2>The excerpt of the trace</h2><pre>{_e(d.excerpt)}</pre></body></html>\n")


# --- drawing -----------------------------------------------------------------

CPU_COLOURS = ["#1f5fa8", "#b35900", "#2e7d32", "#6a1b9a"]
CPU_FILLS = ["#dbe7f5", "#f6e2cc", "#dcefdc", "#eadcf2"]
RED = "#b00020"
GREY = "#888888"


def _e(s) -> str:
    return html.escape(str(s), quote=True)


def _f(v: float) -> str:
    """A coordinate, to a tenth of a pixel."""
    return f"{v:.1f}"


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs) -> ET.Element:
    """A child element; an attribute name's underscores become hyphens
    (class_ is class): stroke_width="3" is stroke-width="3"."""
    el = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v)
                                     for k, v in attrs.items()})
    if text is not None:
        el.text = text
    return el


def _nice_step(span_us: float, target: int = 8) -> float:
    raw = span_us / target
    for m in (0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000,
              2000, 5000, 10000):
        if m >= raw:
            return m
    return raw


def _rows(intervals):
    """Greedy sub-row assignment so that bars in one lane do not overlap."""
    ends, out = [], []
    for lo, hi in intervals:
        for i, e in enumerate(ends):
            if lo >= e:
                ends[i] = hi
                out.append(i)
                break
        else:
            ends.append(hi)
            out.append(len(ends) - 1)
    return out, max(1, len(ends))


@dataclass
class _Layout:
    """Where everything of a timeline goes: the events drawn, the time scale
    (x() maps nanoseconds to pixels), the lanes and their sub-rows."""
    writes: list
    spans: list
    irqs: list
    rets: list
    cpus: list
    t0: int
    lo_ns: float
    hi_ns: float
    left: int
    right: int
    width: int
    q_rows: dict
    b_rows: dict
    due: dict
    row_h: int
    lanes: list                 # (key, label, sub, y_top, height)
    lane: dict
    axis_y: int
    height: int

    def x(self, t: float) -> float:
        return self.left + (t - self.lo_ns) / (self.hi_ns - self.lo_ns) * \
            (self.width - self.left - self.right)


def render_svg(tr: Trace, title: str = "", width: int = 960, ident: str = "tl",
               doorbell: int | None = None) -> str:
    """An SVG timeline of the trace's complete writes, reads and mmiowb() waits
    (doorbell: the register drawn as the doorbell, by default the card's), built
    as an ElementTree (which escapes every text and attribute)."""
    doorbell = ring().doorbell if doorbell is None else doorbell
    L = _layout(tr, title, width)
    svg, g, arrow = _draw_frame(L, title, ident)
    _draw_axis(g, L)
    _draw_spans(g, L)
    _draw_interrupts(g, L)
    _draw_writes(g, L, arrow, doorbell)
    _draw_legend(g, L)
    return ET.tostring(svg, encoding="unicode")


def _layout(tr: Trace, title: str, width: int) -> _Layout:
    """Lay out the trace's complete writes and what happened around them;
    TraceError if none is complete or their times are out of order."""
    writes = sorted((w for w in tr.writes.values() if w.complete), key=lambda w: w.seq)
    if len(writes) < 1:
        raise TraceError("no write has a post, a drain and an arrival in this trace")
    bad = [w for w in writes if not (w.post <= w.drain <= w.arrive)]
    if bad:
        w = bad[0]
        raise TraceError(
            f"write seq={w.seq}: post {w.post} ns, drain {w.drain} ns, arrival {w.arrive} ns "
            "are out of order: was the trace recorded with trace_clock 'mono' "
            "(scripts/trace-timeline sets it)?")
    spans = [s for s in tr.spans if s.end >= writes[0].post and s.start <= writes[-1].arrive]
    card = tr.card_irq
    irqs = [q for q in tr.irqs if card is None or q.irq == card]
    rets = [r for r in tr.returns if r.disabled is not None]
    marks = [q.ts for q in irqs] + [r.ts for r in rets]
    cpus = sorted({w.cpu for w in writes} | {s.cpu for s in spans} | {q.cpu for q in irqs}
                  | {r.cpu for r in rets})
    t0 = min([w.post for w in writes] + [s.start for s in spans] + marks)
    t1 = max([w.arrive for w in writes] + [s.end for s in spans] + marks)
    span_ns = max(t1 - t0, 1000)
    left, right = 118, 24
    plot_w = width - left - right
    pad = span_ns * 0.03
    lo_ns, hi_ns = t0 - pad, t1 + pad

    def x(t):
        return left + (t - lo_ns) / (hi_ns - lo_ns) * plot_w

    # Lanes and sub-rows.
    q_rows, q_n = {}, {}
    for c in cpus:
        ws = [w for w in writes if w.cpu == c]
        rows, n = _rows([(x(w.post) - 2, x(w.drain) + 40) for w in ws])
        q_rows.update({w.seq: r for w, r in zip(ws, rows)})
        q_n[c] = n
    b_order = sorted(writes, key=lambda w: (w.drain, w.seq))
    # When each write was due at the device: bridge_ns after it entered the
    # bridge, and not before the write ahead of it (the bridge is a FIFO).
    # The fabric delivers a due write at the next access or when its timer
    # fires, so the recorded arrival can be later.
    bridge_ns = fabric_param(tr.header.get("fabric", ""), "bridge_ns")
    due, tail = {}, 0
    for w in b_order:
        tail = due[w.seq] = min(max(w.drain + bridge_ns, tail), w.arrive)
    rows, b_n = _rows([(x(w.drain) - 2, x(w.arrive) + 2) for w in b_order])
    b_rows = {w.seq: r for w, r in zip(b_order, rows)}
    row_h = 15
    lanes = []                  # (key, label, sub, y_top, height)
    y = 40 if title else 14
    for c in cpus:
        h = 44 + q_n.get(c, 1) * row_h
        lanes.append((("cpu", c), f"CPU {c}", "posted-write queue", y, h))
        y += h
    h = 30 + b_n * row_h
    lanes.append((("bridge", 0), "I/O bridge", "one FIFO, in order", y, h))
    y += h
    lanes.append((("device", 0), "Device", "ring card", y, 70))
    y += 70
    lane = {k: (top, hgt) for k, _, _, top, hgt in lanes}
    axis_y = y + 8
    height = axis_y + 108 + (13 if irqs or rets else 0)

    return _Layout(writes, spans, irqs, rets, cpus, t0, lo_ns, hi_ns, left, right, width, q_rows,
                   b_rows, due, row_h, lanes, lane, axis_y, height)


def _draw_frame(L: _Layout, title: str, ident: str):
    """The svg element, its title, description, style and arrow heads, the
    lanes' backgrounds and labels: (svg, the group to draw in, arrow(colour))."""
    svg = ET.Element("svg", {"xmlns": "http://www.w3.org/2000/svg", "class": "mmiosim-timeline",
                             "width": str(L.width), "height": str(L.height),
                             "viewBox": f"0 0 {L.width} {L.height}", "role": "img",
                             "aria-labelledby": f"{ident}-title {ident}-desc"})
    n_over = sum(w.overtaken for w in L.writes)
    n_stale = sum(w.stale for w in L.writes)
    desc = (f"{len(L.writes)} writes traced on CPUs {', '.join(map(str, L.cpus))}, from post to "
            f"arrival; {n_over} overtaken in the bridge, {n_stale} stale doorbells; "
            f"{sum(s.kind == 'mmiowb' for s in L.spans)} mmiowb() waits, "
            f"{sum(s.kind == 'read' for s in L.spans)} reads.")
    _el(svg, "title", title or "Recorded mmiosim trace", id=f"{ident}-title")
    _el(svg, "desc", desc, id=f"{ident}-desc")
    _el(svg, "style",
        f"#{ident} text{{font-family:'DejaVu Sans',Arial,sans-serif;font-size:11px;fill:#333}}"
        f"#{ident} .row{{font-size:13px;font-weight:bold;fill:#222}}"
        f"#{ident} .sub{{font-size:10.5px;fill:#666}}"
        f"#{ident} .code{{font-family:'DejaVu Sans Mono',monospace;font-size:11px}}"
        f"#{ident} .ttl{{font-size:13px;font-weight:bold}}")
    g = _el(svg, "g", id=ident)
    palette = CPU_COLOURS + [GREY, RED]
    defs = _el(g, "defs")
    for i, c in enumerate(palette):
        marker = _el(defs, "marker", id=f"{ident}-arr{i}", viewBox="0 0 10 10", refX="9",
                     refY="5", markerWidth="6", markerHeight="6", orient="auto")
        _el(marker, "path", d="M0,0 L10,5 L0,10 z", fill=c)

    def arrow(colour):
        return f"url(#{ident}-arr{palette.index(colour)})"
    _el(g, "rect", x=0, y=0, width=L.width, height=L.height, fill="white")
    if title:
        _el(g, "text", title, x=12, y=22, class_="ttl")
    for i, (key, label, sub, top, hgt) in enumerate(L.lanes):
        if i % 2 == 0:
            _el(g, "rect", x=0, y=top, width=L.width, height=hgt, fill="#f7f7f7")
        colour = CPU_COLOURS[key[1] % 4] if key[0] == "cpu" else "#222"
        _el(g, "text", label, x=10, y=top + 20, class_="row", style=f"fill:{colour}")
        _el(g, "text", sub, x=10, y=top + 34, class_="sub")
    return svg, g, arrow


def _draw_axis(g: ET.Element, L: _Layout) -> None:
    # Time axis, in microseconds from the first event shown.
    step_us = _nice_step((L.hi_ns - L.lo_ns) / 1000)
    _el(g, "line", x1=L.left, y1=L.axis_y, x2=L.width - L.right, y2=L.axis_y, stroke="#888")
    k = 0
    while True:
        t_us = k * step_us
        tx = L.x(L.t0 + t_us * 1000)
        if tx > L.width - L.right + 0.5:
            break
        _el(g, "line", x1=_f(tx), y1=L.lanes[0][3], x2=_f(tx), y2=L.axis_y, stroke="#e3e3e3")
        _el(g, "line", x1=_f(tx), y1=L.axis_y, x2=_f(tx), y2=L.axis_y + 5, stroke="#888")
        _el(g, "text", f"{t_us:g}", x=_f(tx), y=L.axis_y + 17, text_anchor="middle")
        k += 1
    _el(g, "text", "time since the first event shown, \u00b5s (the fabric's clock; "
        f"t0 = {L.t0} ns)", x=L.width - L.right, y=L.axis_y + 31, text_anchor="end", class_="sub")



def _draw_spans(g: ET.Element, L: _Layout) -> None:
    # mmiowb() waits and reads on their CPU's lane.
    for s in L.spans:
        top, hgt = L.lane[("cpu", s.cpu)]
        x0, x1 = L.x(s.start), max(L.x(s.end), L.x(s.start) + 2)
        colour = CPU_COLOURS[s.cpu % 4]
        yb = top + hgt - 16
        cls = "mmiosim-mmiowb" if s.kind == "mmiowb" else "mmiosim-read"
        label = "mmiowb()" if s.kind == "mmiowb" else "readl()"
        inside = x1 - x0 >= 5.6 * len(label) + 6
        lx, anchor = ((x0 + x1) / 2, "middle") if inside else (x1 + 3, "start")
        item = _el(g, "g", class_=cls)
        _el(item, "title", f"{s.detail} (trace line {s.lineno})")
        _el(item, "rect", x=_f(x0), y=yb, width=_f(x1 - x0), height=11, rx=2, fill="white",
            stroke=colour, stroke_dasharray="3 2" if s.kind == "mmiowb" else "none")
        _el(item, "text", label, x=_f(lx), y=yb + 9, text_anchor=anchor, class_="code",
            style=f"font-size:9px;fill:{colour}")



def _draw_interrupts(g: ET.Element, L: _Layout) -> None:
    # Interrupt handlers (a triangle where one starts) and the return of the
    # call that disabled the card's interrupts (a line across its CPU's lane).
    for r in L.rets:
        top, hgt = L.lane[("cpu", r.cpu)]
        xr = L.x(r.ts)
        colour = CPU_COLOURS[r.cpu % 4]
        item = _el(g, "g", class_="mmiosim-return")
        _el(item, "title", f"{r.task}: {r.call} returns (it posted INT_ENABLE=0, seq "
            f"{r.disabled.seq}; trace line {r.lineno})")
        _el(item, "line", x1=_f(xr), y1=top + 2, x2=_f(xr), y2=top + hgt - 2, stroke=colour,
            stroke_width="1.5", stroke_dasharray="4 2")
        _el(item, "text", f"{r.call} returns", x=_f(xr + 3), y=top + 11, class_="code",
            style=f"font-size:9.5px;fill:{colour}")
    for q in L.irqs:
        top, hgt = L.lane[("cpu", q.cpu)]
        xq = L.x(q.ts)
        colour = RED if q.late else CPU_COLOURS[q.cpu % 4]
        label = "late IRQ" if q.late else "IRQ"
        item = _el(g, "g", class_="mmiosim-irq" + (" late" if q.late else ""))
        _el(item, "title", f"irq {q.irq} ({q.name}): its handler starts on CPU {q.cpu} at "
            f"+{(q.ts - L.t0) / 1000:.2f} \u00b5s"
            f"{', after the call that disabled it had returned' if q.late else ''} "
            f"(trace line {q.lineno})")
        _el(item, "path", d=f"M{_f(xq - 5)},{top + 3} L{_f(xq + 5)},{top + 3} L{_f(xq)},{top + 12} z",
            fill=colour)
        _el(item, "text", label, x=_f(xq), y=top + 23, text_anchor="middle", class_="code",
            style=f"font-size:9.5px;fill:{colour}" + (";font-weight:bold" if q.late else ""))



def _draw_writes(g: ET.Element, L: _Layout, arrow, doorbell: int) -> None:
    dev_top, dev_h = L.lane[("device", 0)]
    b_top, b_h = L.lane[("bridge", 0)]
    label_slots = []
    # The interrupt disables whose call returned (and those a late interrupt followed).
    disables = {r.disabled.seq for r in L.rets}
    too_late = {r.disabled.seq for r in L.rets if any(q.late and q.lineno > r.lineno for q in L.irqs)
                or r.disabled.arrive is None or r.disabled.arrive > r.ts}
    for w in L.writes:
        is_db = w.off == doorbell
        is_off = w.seq in disables
        colour = CPU_COLOURS[w.cpu % 4] if is_db or is_off else GREY
        hot = RED if (w.overtaken or w.stale or w.seq in too_late) else colour
        top, hgt = L.lane[("cpu", w.cpu)]
        qy = top + 26 + L.q_rows[w.seq] * L.row_h
        by = b_top + 20 + L.b_rows[w.seq] * L.row_h
        xp, xd, xa = L.x(w.post), L.x(w.drain), L.x(w.arrive)
        reg = ring().name(w.off)
        classes = "mmiosim-write" + (" doorbell" if is_db else "") + \
            (" overtaken" if w.overtaken else "") + (" stale" if w.stale else "")
        late = w.post_ts - w.post > 1000
        tip = (f"seq {w.seq}: CPU {w.cpu} writes {w.val} to {reg} (win {w.win}); "
               f"posted at +{(w.post - L.t0) / 1000:.2f} \u00b5s"
               + (" or a little earlier (its trace line, recorded after the fabric delivered "
                  f"earlier writes, says +{(w.post_ts - L.t0) / 1000:.2f} \u00b5s)" if late else "")
               + f", enters the bridge at "
               f"+{(w.drain - L.t0) / 1000:.2f} \u00b5s"
               + (" behind a write posted later (overtaken)" if w.overtaken else "")
               + f", arrives at +{(w.arrive - L.t0) / 1000:.2f} \u00b5s"
               + (" after a later doorbell (stale)" if w.stale else ""))
        item = _el(g, "g", class_=classes, data_seq=w.seq, data_cpu=w.cpu,
                data_off=f"{w.off:#x}", data_val=w.val)
        _el(item, "title", tip)
        thick, thin = ("3", "1.6") if is_db else ("1.5", "1")
        # queued on its CPU: post -> drain
        _el(item, "circle", cx=_f(xp), cy=qy, r="3.5" if is_db else "2.5", fill=colour)
        _el(item, "line", x1=_f(xp), y1=qy, x2=_f(xd), y2=qy, stroke=colour, stroke_width=thick,
            stroke_opacity="0.55")
        label = f"{w.val}" if is_db else f"{reg}={w.val}" if is_off else reg
        _el(item, "text", label, x=_f(xp - 5), y=qy + 4, text_anchor="end", class_="code",
            style=f"fill:{colour}")
        # into the bridge
        _el(item, "line", x1=_f(xd), y1=qy, x2=_f(xd), y2=by, stroke=hot, stroke_width=thin,
            marker_end=arrow(hot))
        # in the bridge: drain -> due (solid), due -> delivered (dotted)
        xu = L.x(L.due[w.seq])
        _el(item, "line", x1=_f(xd), y1=by, x2=_f(xu), y2=by, stroke=hot, stroke_width=thick,
            stroke_opacity="0.55")
        if xa - xu > 1:
            _el(item, "line", x1=_f(xu), y1=by, x2=_f(xa), y2=by, stroke=hot, stroke_width=thin,
                stroke_dasharray="2 3")
        if w.overtaken:
            _el(item, "text", "overtaken", x=_f(xd + 4), y=by - 3,
                style=f"fill:{RED};font-weight:bold")
        # to the device
        dy = dev_top + 16
        _el(item, "line", x1=_f(xa), y1=by, x2=_f(xa), y2=dy - 5, stroke=hot, stroke_width=thin,
            marker_end=arrow(hot))
        _el(item, "circle", cx=_f(xa), cy=dy, r="5" if is_db else "3", fill=hot, stroke="white")
        if is_db or is_off:
            txt = f"sees {w.val}" + (" (stale)" if w.stale else "") if is_db else \
                "interrupts off" + (" (too late)" if w.seq in too_late else "")
            half = 3.4 * len(txt)
            cx = min(max(xa, L.left + half), L.width - 4 - half)
            slot = 0
            while any(r == slot and abs(c - cx) < h + half + 4 for c, h, r in label_slots):
                slot += 1
            label_slots.append((cx, half, slot))
            bold = ";font-weight:bold" if w.stale or w.seq in too_late else ""
            _el(item, "text", txt, x=_f(cx), y=dy + 18 + slot * 13, text_anchor="middle",
                class_="code", style=f"fill:{hot}{bold}")



def _draw_legend(g: ET.Element, L: _Layout) -> None:
    # Legend.
    ly = L.axis_y + 50
    lx = L.left
    items = [(CPU_COLOURS[c % 4], f"CPU {c}: doorbell write") for c in L.cpus]
    items += [(GREY, "other register write"),
              (RED, "overtaken / stale / late" if L.irqs else "overtaken / stale")]
    for colour, text in items:
        _el(g, "line", x1=lx, y1=ly - 4, x2=lx + 22, y2=ly - 4, stroke=colour,
            stroke_width="3", stroke_opacity="0.7")
        _el(g, "text", text, x=lx + 27, y=ly, class_="sub")
        lx += 35 + 6.2 * len(text)
    notes = ["Each write: a dot when its CPU posts it, a bar while it waits in its CPU's queue, "
             "a bar while it crosses the bridge",
             "(dotted once it is due at the device, until the fabric delivers it), a dot when it "
             "arrives. A doorbell's number is the",
             "producer index it carries. Boxes on a CPU's lane: mmiowb() waiting (dashed), "
             "readl() round trips."]
    if L.irqs or L.rets:
        notes.append("Triangles: the card's interrupt handler starts on that CPU (late: after "
                     "the call that disabled it had returned, dashed line).")
    for i, note in enumerate(notes):
        _el(g, "text", note, x=L.left, y=ly + 18 + 13 * i, class_="sub")


# ------------------------------------------------------------- recordings on the wire

RECORD_RE = re.compile(r"^=== mmiolab record (\d+) (begin|end) ===$")


@dataclass
class Recording:
    number: int
    text: str               # the trace file as the guest wrote it ("" if it did not arrive whole)
    problem: str = ""       # why it is incomplete


class TooLarge(MmiolabError, ValueError):
    """Compressed data that inflates to more than its cap."""


def gunzip(data: bytes, cap: int = MAX_RECORDING) -> bytes:
    """gzip.decompress with an output cap: reads at most cap + 1 bytes of output
    (and each gzip member in turn) and raises TooLarge past cap, so a small
    crafted stream cannot fill the host's memory."""
    out = bytearray()
    while data:
        d = zlib.decompressobj(wbits=31)
        chunk = d.decompress(data, cap + 1 - len(out))
        out += chunk
        while len(out) <= cap and d.unconsumed_tail and not d.eof:
            out += d.decompress(d.unconsumed_tail, cap + 1 - len(out))
        if len(out) > cap:
            raise TooLarge(f"it inflates to more than {cap >> 20} MiB")
        if not d.eof:
            raise EOFError("the gzip stream is cut short")
        data = d.unused_data.lstrip(b"\0")
    return bytes(out)


def recordings_in(data: str) -> list[Recording]:
    """The recordings vm/record sent on a serial line (gzip'd, base64'd, between
    marker lines), in the order sent; everything between them is ignored. Each
    is inflated to at most MAX_RECORDING bytes."""
    out, cur, body = [], None, []
    for line in data.replace("\r", "").split("\n"):
        m = RECORD_RE.match(line) if len(line) < 80 else None
        if m and m.group(2) == "begin":
            if cur is not None:
                out.append(Recording(cur, "", "another recording began before it ended"))
            cur, body = int(m.group(1)), []
        elif m and cur is not None and int(m.group(1)) == cur:
            try:
                text = gunzip(base64.b64decode("".join(body), validate=True))
                out.append(Recording(cur, text.decode("utf-8", "replace")))
            except TooLarge as e:
                out.append(Recording(cur, "", f"it was not read: {e}"))
            except (binascii.Error, OSError, EOFError, zlib.error) as e:
                out.append(Recording(cur, "", f"it arrived damaged ({e})"))
            cur = None
        elif cur is not None:
            body.append(line.strip())
    if cur is not None:
        out.append(Recording(cur, "", "the VM stopped while it was being sent"))
    return out
