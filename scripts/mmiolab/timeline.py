"""Timelines of recorded runs: parse ftrace output of the lab kernel's mmiosim
trace events, find the first stale doorbell or late interrupt, draw it.

One implementation for every picture of a run: the docs' figures
(Documentation/sphinx/tracefig.py), the instructor's recordings
(scripts/trace-timeline), the student's own runs in the lab VM (the guest's
``record`` helper, then ``scripts/kit timeline``) and, later, the grader's
reports. Standard library only.

The events (include/trace/events/mmiosim.h of the patched tree), as
/sys/kernel/tracing/trace prints them::

    ringtest-55 [001] d.... 1.280073: mmiosim_post: win=0 cpu=1 seq=6 off=0x1c val=0x6 t=1280075153 posted=1280073020
    <idle>-0    [000] d.h.. 1.280079: mmiosim_drain: cpu=1 seq=6 t=1280075153 overtaken
    <idle>-0    [000] d.h.. 1.280080: mmiosim_arrive: win=0 cpu=1 seq=6 off=0x1c val=0x6 t=1280076170 posted=1280073020
    ringtest-54 [000] ..... 1.280090: mmiosim_mmiowb: cpu=0 wait=4210 t=1280085390
    ringtest-54 [000] ..... 1.280120: mmiosim_read: win=0 cpu=0 off=0x20 val=0x6 cost=23100 t=1280096610

t= and posted= are the fabric's clock, in ns: for post, t= is the time the
write will leave its CPU's queue; for drain, the time it entered the bridge;
for arrive, the time the device got it; posted= (post and arrive) is when
the write was posted; for mmiowb and read, t= is when the wait began (it
ended wait= or cost= later). The line's own timestamp (seconds, rounded to
the microsecond) is when the event was recorded, with trace_clock "mono" on
the kernel's monotonic clock.

The fabric's clock is that clock (mmiosim.clock=real, the default), or runs
ahead of it (mmiosim.clock=skip: a CPU that would wait for the fabric raises
a lead that only grows, instead of spinning), so the lines' timestamps are
read on the fabric's clock only where the trace gives no fabric time.
Events of an older kernel have no posted=, and no t= on mmiowb and read:
there the clock was the monotonic one, and a write's post, the end of a read
or an mmiowb() are the line's timestamp (see model()). The kernel's own
events below have only their line's timestamp: model() puts them on the
fabric's clock by the lead the fabric's events before them show.

Two of the kernel's own events complete the picture of an interrupt that
comes too late: ``irq:irq_handler_entry`` (``irq=25 name=postdrv``: a
handler starts, on the CPU of the line) and ``raw_syscalls:sys_exit``
(``NR 16 = 0``: a task's system call returns to user space). Other events
are ignored. The card's register names (labels, the doorbell, INT_ENABLE)
are read from the kernel's include/linux/mmiosim_ring.h (ring(src)).

A recorded file may start with "# key: value" header lines (written by the
guest's ``record`` helper and by scripts/trace-timeline): ``fabric`` (the
line of /sys/kernel/debug/mmiosim/params), ``card_irq`` (the card's
interrupt number), ``trace_clock``, ``fabric_lead_ns`` (an excerpt's: the
lead its trace showed before the excerpt's first line) and others.
ftrace's own "#" lines are read for one thing: whether the buffer
overflowed.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import functools
import html
import os
import re
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
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

# The ring card's register map is the kernel header's, read at run time (ring(src)).
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
    regs: dict[int, str]

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
def ring(src: str) -> Ring:
    """The ring card's registers, from include/linux/mmiosim_ring.h of the lab
    kernel's source tree src (kernel.tree(cfg).src; a handout's prebuilt tree
    carries it); a TraceError says where it looked."""
    path = os.path.join(src, RING_HEADER)
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
    fields: dict[str, str]
    flags: set[str]
    pid: int = -1
    cpu: int = -1           # the CPU that recorded the line
    # ns: ts_ns on the fabric's clock: plus the lead the events up to it
    # showed (model(): the same as ts_ns under mmiosim.clock=real)
    at_ns: int = 0


@dataclass
class Write:
    seq: int
    cpu: int
    win: int
    off: int
    val: int
    post: int | None = None         # ns: when it was posted (see model())
    # ns: the post line's own timestamp (on the fabric's clock: its at_ns),
    # when the event does not say when the write was posted (no posted=)
    post_ts: int | None = None
    drain: int | None = None        # ns (t= of the drain event)
    arrive: int | None = None       # ns (t= of the arrive event)
    overtaken: bool = False         # entered the bridge behind a later-posted write
    stale: bool = False             # a doorbell that arrived after a later-posted one
    pid: int = -1                   # the task that posted it
    task: str = ""
    lines: list[int] = field(default_factory=list)
    ring: Ring = field(kw_only=True, repr=False, compare=False)    # the card's register names

    @property
    def complete(self) -> bool:
        return None not in (self.post, self.drain, self.arrive)

    # The times of a write the trace has them for (a complete write's, which
    # the finders and the drawing read): a TraceError names a missing one.
    @property
    def posted(self) -> int:
        return self._time(self.post, "post")

    @property
    def drained(self) -> int:
        return self._time(self.drain, "drain")

    @property
    def arrived(self) -> int:
        return self._time(self.arrive, "arrive")

    def _time(self, t: int | None, what: str) -> int:
        if t is None:
            raise TraceError(f"write seq={self.seq} has no {what} time (a lost trace line)")
        return t

    @property
    def reg(self) -> str:
        return self.ring.name(self.off)


@dataclass
class Span:
    kind: str               # "mmiowb" or "read"
    cpu: int
    start: int              # ns, on the fabric's clock (see model())
    end: int
    detail: str
    lineno: int


@dataclass
class Irq:
    """An interrupt handler started (irq:irq_handler_entry)."""
    cpu: int
    ts: int                 # ns, on the fabric's clock: its line's at_ns
    irq: int
    name: str
    lineno: int
    late: bool = False      # the card's, after the call that disabled it had returned


@dataclass
class Return:
    """A system call returned to user space (raw_syscalls:sys_exit)."""
    cpu: int
    ts: int                 # ns, on the fabric's clock: its line's at_ns
    pid: int
    task: str
    nr: int
    ret: int
    lineno: int
    disabled: Write | None = None   # the interrupt-disable write this call posted

    @property
    def disable_write(self) -> Write:
        """disabled, of a return that has one (the finders' and the picture's)."""
        if self.disabled is None:
            raise TraceError(f"trace line {self.lineno}: the call posted no interrupt disable")
        return self.disabled

    @property
    def call(self) -> str:
        return f"{SYSCALLS[self.nr]}()" if self.nr in SYSCALLS else f"system call {self.nr}"


@dataclass
class Trace:
    header: dict[str, str]
    events: list[Event]
    writes: dict[int, Write]        # seq -> Write
    spans: list[Span]               # mmiowb() waits and reads
    irqs: list[Irq] = field(default_factory=list)
    returns: list[Return] = field(default_factory=list)
    lost: int = 0           # events ftrace says it dropped (a buffer that overflowed)
    ring: Ring = field(kw_only=True, repr=False, compare=False)    # the card's register map

    @property
    def card_irq(self) -> int | None:
        v = self.header.get("card_irq", "")
        # (isdigit() alone takes "\u00b2", which int() does not)
        return int(v) if v.isascii() and v.isdigit() else None


def _num(s: str) -> int:
    return int(s, 0)


def parse(text: str, route_ns: list[int] | None = None, *, ring: Ring) -> Trace:
    """Parse trace text (a whole /sys/kernel/tracing/trace, or an excerpt);
    ring: the card's register map (ring(kernel source)).

    route_ns: the fabric's route latencies (default: from a "# fabric:"
    header line, else none), used to place each write's post (see model()).
    """
    header: dict[str, str] = {}
    events: list[Event] = []
    overwritten, lost = 0, 0
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
    tr = model(header, events, route_ns, ring=ring)
    # The same loss may be told both ways (the header's count, a LOST line).
    tr.lost = max(overwritten, lost)
    return tr


def _fields(rest: str) -> dict[str, str]:
    """key=value words (key: word characters), in linear time: in each word, the
    first '=' with a key before it and a value after it, as
    re.findall(r"(\\w+)=(\\S+)") finds them, without its quadratic worst case."""
    out: dict[str, str] = {}
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


def fabric_routes(params: str) -> list[int]:
    """route_ns from a line of /sys/kernel/debug/mmiosim/params ([] if absent)."""
    m = re.search(r"\broute_ns=([\d,]+)", params)
    return [int(r) for r in m.group(1).split(",") if r] if m else []


def fabric_param(params: str, name: str, default: int = 0) -> int:
    """One numeric parameter from a line of /sys/kernel/debug/mmiosim/params."""
    m = re.search(rf"\b{name}=(\d+)", params)
    return int(m.group(1)) if m else default


#: A line's timestamp is when the event was recorded, rounded to the
#: microsecond (ns2usecs() in kernel/trace/trace.c adds 500 ns, then divides),
#: so under mmiosim.clock=real a fabric time can be up to this much past it.
ROUNDING_NS = 499


#: The kernel prints the fabric's times as u64: a larger one is no time.
U64 = 1 << 64


def _fabric_now(ev: Event) -> int | None:
    """A time on the fabric's clock that the event was recorded at or after
    (ns), or None when it gives none: the post's posted=, the arrival's t=,
    the end of an mmiowb() or a read (t= plus wait= or cost=, a kernel's
    that says t=). ValueError for one past what the kernel prints: the lead
    taken from it would move every later event out of reach."""
    f = ev.fields
    if ev.name == "post" and "posted" in f:
        now = _num(f["posted"])
    elif ev.name == "arrive" and "t" in f:
        now = _num(f["t"])
    elif ev.name in ("mmiowb", "read") and "t" in f:
        now = _num(f["t"]) + _num(f["wait" if ev.name == "mmiowb" else "cost"])
    else:
        return None
    if not 0 <= now < U64:
        raise ValueError("a time past the largest the kernel prints (u64)")
    return now


def fabric_clock(params: str) -> str:
    """The fabric's clock from a line of /sys/kernel/debug/mmiosim/params:
    "real" or "skip" (mmiosim.clock; "real" where the line has no clock=,
    as an older kernel's, which had no other)."""
    m = re.search(r"\bclock=(\w+)", params)
    return m.group(1) if m else "real"


def model(header: dict[str, str], events: list[Event], route_ns: list[int] | None = None,
          *, ring: Ring) -> Trace:
    """Writes, reads, mmiowb() waits, interrupts and returns from the events,
    on the fabric's clock.

    A write's post time is the post's posted=. An older kernel's post has
    none: when a write is posted, the fabric first brings its model up to
    date, which may deliver earlier writes to the device and take a while;
    the post event is recorded after that, so its timestamp can be later
    than the moment the write was posted. The post's t= (when the write
    leaves its CPU's queue) is at least that moment plus the CPU's route
    latency, so a write's post time is then taken as the earlier of the
    line's timestamp and t= minus the route latency. An mmiowb() or a read
    spans t= to t= plus its wait or cost; an older kernel's ends at its
    line's timestamp.

    The kernel's own events (an interrupt, a return) have only their line's
    timestamp. Under mmiosim.clock=skip the fabric's clock runs ahead of it
    by a lead that only grows: each is placed at its timestamp plus the
    lead the fabric's events up to it in the file showed, the largest
    (fabric time - line timestamp) of them (_fabric_now(); the header's
    fabric_lead_ns for what came before an excerpt). What it misses: the
    lead raised since the last fabric event before it (a skip on another
    CPU, or on the recording CPU after its last fabric event), so such an
    event can be drawn too early by that much; and the timestamps' rounding
    (ROUNDING_NS either way). A trace whose fabric header does not say
    clock=skip (clock=real, an older kernel's, none) takes ROUNDING_NS off
    each (fabric time - line timestamp): under mmiosim.clock=real that is
    never above 0, so nothing moves, and under skip the lead comes out at
    most ROUNDING_NS short. Every line's time on that clock is its
    Event.at_ns.
    """
    route_ns = route_ns or [0]
    writes: dict[int, Write] = {}
    spans: list[Span] = []
    irqs: list[Irq] = []
    returns: list[Return] = []
    given = header.get("fabric_lead_ns", "")
    lead = int(given) if re.fullmatch(r"[0-9]{1,20}", given) and int(given) < U64 else 0
    rounding = 0 if fabric_clock(header.get("fabric", "")) == "skip" else ROUNDING_NS

    def write_of(ev: Event, f: dict[str, str]) -> Write:
        seq = _num(f["seq"])
        w = writes.get(seq)
        if w is None:
            w = writes[seq] = Write(seq, _num(f["cpu"]), _num(f.get("win", "-1")),
                                    _num(f.get("off", "-1")), _num(f.get("val", "0")), ring=ring)
        if "off" in f and w.off < 0:
            w.win, w.off, w.val = _num(f["win"]), _num(f["off"]), _num(f["val"])
        w.lines.append(ev.lineno)
        return w

    for ev in events:
        f = ev.fields
        try:
            now = _fabric_now(ev)
            if now is not None:
                lead = max(lead, now - ev.ts_ns - rounding)
            ev.at_ns = ev.ts_ns + lead
            if ev.name == "post":
                w = write_of(ev, f)
                if "posted" in f:
                    w.post = _num(f["posted"])
                else:
                    w.post_ts = ev.at_ns
                    w.post = min(ev.at_ns, _num(f["t"]) - route_ns[w.cpu % len(route_ns)])
                w.pid, w.task = ev.pid, ev.task
            elif ev.name == "drain":
                w = write_of(ev, f)
                w.drain = _num(f["t"])
                w.overtaken = "overtaken" in ev.flags
            elif ev.name == "arrive":
                write_of(ev, f).arrive = _num(f["t"])
            elif ev.name == "mmiowb":
                wait = _num(f["wait"])
                end = ev.ts_ns if now is None else now
                spans.append(Span("mmiowb", _num(f["cpu"]), end - wait, end,
                                  f"mmiowb() waited {wait} ns", ev.lineno))
            elif ev.name == "read":
                cost = _num(f["cost"])
                off = _num(f["off"])
                end = ev.ts_ns if now is None else now
                spans.append(Span("read", _num(f["cpu"]), end - cost, end,
                                  f"readl({ring.name(off)}) took {cost} ns",
                                  ev.lineno))
            elif ev.name == "irq_handler_entry":
                irqs.append(Irq(ev.cpu, ev.at_ns, _num(f["irq"]), f.get("name", ""), ev.lineno))
            elif ev.name == "sys_exit":
                returns.append(Return(ev.cpu, ev.at_ns, ev.pid, ev.task, int(f["nr"]),
                                      int(f["ret"]), ev.lineno))
        except (KeyError, ValueError) as e:
            raise TraceError(f"line {ev.lineno}: malformed {ev.name} event ({e})")
    # A doorbell is stale when it arrives after a doorbell posted later.
    newest: dict[int, int] = {}         # window -> the latest seq arrived
    for w in sorted((w for w in writes.values() if w.arrive is not None and w.off == ring.doorbell),
                    key=lambda w: (w.arrive, w.lines[-1])):
        if w.win in newest and w.seq < newest[w.win]:
            w.stale = True
        newest[w.win] = max(newest.get(w.win, -1), w.seq)
    tr = Trace(header, events, writes, spans, irqs, returns, ring=ring)
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
    STOP returned.) "After" is by the lines' order, the order they were
    recorded in, which no lead of the fabric's clock changes.
    """
    irq = tr.card_irq
    if not tr.returns:
        return
    enables = sorted((w for w in tr.writes.values() if w.off == tr.ring.int_enable and w.lines),
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


def first_reordering(tr: Trace, off: int | None = None) -> tuple[Write, Write] | None:
    """The first doorbell (off: by default the card's) that arrived stale, and the
    later-posted one it arrived after.

    Returns (old, new) Writes, or None when no doorbell arrived out of order.
    """
    off = tr.ring.doorbell if off is None else off
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


def first_late_interrupt(tr: Trace) -> tuple[Write, Return, Irq] | None:
    """The first late interrupt of the card: (the disabling write, the return of the
    call that posted it, the interrupt), or None."""
    late = next((q for q in tr.irqs if q.late), None)
    if late is None:
        return None
    ret = max((r for r in tr.returns if r.disabled is not None and r.lineno < late.lineno),
              key=lambda r: r.lineno)
    return ret.disable_write, ret, late


def first_early_return(tr: Trace) -> Return | None:
    """The first call that posted an interrupt disable and returned before the
    write reached the card (what the posting lab's test asks the card), or None."""
    return next((r for r in sorted(tr.returns, key=lambda r: r.lineno)
                 if r.disabled is not None
                 and (r.disabled.arrive is None or r.disabled.arrive > r.ts)), None)


def first_handoff(tr: Trace, barrier: str = "mmiowb", off: int | None = None
                  ) -> tuple[Write, Write] | None:
    """A lock hand-over: a doorbell, then the next doorbell, from another CPU.

    Among such pairs, picks one where the first CPU's barrier (barrier:
    "mmiowb" or "read") ran between the two posts and the second CPU posted
    soonest after that barrier ended, i.e. took the lock right after it was
    released; for "mmiowb", one where the first doorbell was still on its
    way to the device when mmiowb() returned (ordering without arrival).
    Returns (first, second) Writes, or None.
    """
    off = tr.ring.doorbell if off is None else off
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
        i = bisect.bisect_left(cpu_ends, a.posted)
        if i == len(cpu_ends) or cpu_ends[i] > b.posted:
            continue
        end = cpu_ends[i]
        if barrier == "mmiowb" and a.arrived <= end:
            continue
        gap = b.posted - end
        if best is None or gap < best[0]:
            best = (gap, a, b)
    return (best[1], best[2]) if best else None


def last_crossing(tr: Trace, off: int | None = None) -> tuple[Write, Write] | None:
    """The last two consecutive doorbells posted from different CPUs, or None."""
    off = tr.ring.doorbell if off is None else off
    dbs = sorted((w for w in tr.writes.values() if w.complete and w.off == off),
                 key=lambda w: w.seq)
    pairs = [(a, b) for a, b in zip(dbs, dbs[1:]) if a.cpu != b.cpu and a.win == b.win]
    return pairs[-1] if pairs else None


def _us(ns: int) -> str:
    return f"{ns / 1000:.1f} \u00b5s"


def describe_reordering(old: Write, new: Write) -> str:
    # A recording whose per-CPU trace buffer overflowed can lack a write's
    # drain line: the order the card saw still stands, the lead does not.
    lead = (f"{(old.drain - new.drain) / 1000:.2f} \u00b5s earlier"
            if old.drain is not None and new.drain is not None else
            "earlier (the trace lost one of the two drain times)")
    return (f"CPU {old.cpu} wrote doorbell {old.val} (seq={old.seq}); CPU {new.cpu} wrote "
            f"{new.val} (seq={new.seq}) after it, which entered the bridge "
            f"{lead} (seq={old.seq} overtaken); "
            f"the card saw {new.val} and then {old.val}: a stale doorbell")


def describe_late(d: Write, ret: Return, q: Irq) -> str:
    when = ("before it arrived" if d.arrive is None or q.ts < d.arrive else
            f"{_us(q.ts - d.arrive)} after it arrived (raised before: the card raises its "
            "interrupt only while it is enabled)")
    return (f"{d.task or 'a task'} on CPU {d.cpu} wrote 0 to INT_ENABLE (seq={d.seq}) and its "
            f"{ret.call} returned {_us(ret.ts - d.posted)} later"
            + (f"; the write reached the card {_us(d.arrived - d.posted)} after it was posted"
               if d.arrive is not None else "; the write had not reached the card when the "
               "trace ends")
            + f"; the card's interrupt (irq {q.irq}) was handled on CPU {q.cpu} "
            f"{_us(q.ts - ret.ts)} after that return, {when}: a late interrupt")


def describe_early_return(d: Write, ret: Return) -> str:
    return (f"{d.task or 'a task'} on CPU {d.cpu} wrote 0 to INT_ENABLE (seq={d.seq}) and its "
            f"{ret.call} returned {_us(ret.ts - d.posted)} later, "
            + (f"{_us(d.arrive - ret.ts)} before the write reached the card"
               if d.arrive is not None else "before the write reached the card (not by the "
               "end of the trace)")
            + ": the card's interrupt was still on when the call returned")


def describe_handoff(tr: Trace, a: Write, b: Write, barrier: str) -> str:
    span = next(sp for sp in tr.spans if sp.kind == barrier and sp.cpu == a.cpu
                and a.posted <= sp.end <= b.posted)
    if barrier == "mmiowb":
        return (f"CPU {a.cpu} wrote doorbell {a.val} (seq={a.seq}) and waited in mmiowb() "
                f"for {_us(span.end - span.start)}, until the write had entered the bridge; "
                f"CPU {b.cpu} then took the lock and wrote {b.val} (seq={b.seq}), which "
                "entered the bridge behind it"
                + (f", {_us(a.arrived - b.drained)} before {a.val} reached the device: mmiowb() "
                   "ordered the writes without waiting for arrival"
                   if b.drained < a.arrived else ""))
    return (f"CPU {a.cpu} wrote doorbell {a.val} (seq={a.seq}) and read back from the "
            f"card before unlocking; the read took {_us(span.end - span.start)} and "
            f"returned after the write had arrived; CPU {b.cpu} then took the lock and "
            f"wrote {b.val} (seq={b.seq})")


# seq -> (label on its CPU's queue, label in the bridge): the writes a finding names.
Marked = dict[int, tuple[str, str]]


@dataclass
class Finding:
    kind: str               # stale-doorbell | late-interrupt | early-return | mmiowb | read
    #                         | disable | crossing
    text: str               # one sentence: what the excerpt shows
    lines: list[int]        # the excerpt's line numbers in the trace (1-based)
    # The writes the sentence names: seq -> (label on its CPU's queue, label in
    # the bridge), as the sentence words them; the picture marks them.
    marked: Marked = field(default_factory=dict)

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
        old, new = pair
        return Finding("stale-doorbell", describe_reordering(*pair),
                       excerpt_lines(tr, pair, context_writes=1),
                       {old.seq: (f"doorbell {old.val} (seq={old.seq})", "overtaken"),
                        new.seq: (f"{new.val} (seq={new.seq})", f"overtook seq={old.seq}")})
    late = first_late_interrupt(tr)
    if late:
        d, ret, q = late
        return Finding("late-interrupt", describe_late(d, ret, q),
                       excerpt_lines(tr, _with_doorbell_before(tr, d), 0, upto=q.lineno),
                       {d.seq: (f"INT_ENABLE=0 (seq={d.seq})", "")})
    early = first_early_return(tr)
    if early:
        d = early.disable_write
        return Finding("early-return", describe_early_return(d, early),
                       excerpt_lines(tr, _with_doorbell_before(tr, d), 0,
                                     upto=early.lineno),
                       {d.seq: (f"INT_ENABLE=0 (seq={d.seq})", "")})
    for barrier in ("mmiowb", "read"):
        pair = first_handoff(tr, barrier)
        if pair:
            a, b = pair
            return Finding(barrier, describe_handoff(tr, *pair, barrier),
                           excerpt_lines(tr, pair, context_writes=0),
                           {a.seq: (f"doorbell {a.val} (seq={a.seq})", ""),
                            b.seq: (f"{b.val} (seq={b.seq})", "")})
    disables = [r for r in tr.returns if r.disabled is not None]
    if disables:
        last = max(disables, key=lambda r: r.lineno)
        d = last.disable_write
        return Finding("disable",
                       f"{d.task or 'a task'} on CPU {d.cpu} wrote 0 to INT_ENABLE (seq={d.seq})"
                       + (f"; it reached the card {_us(d.arrived - d.posted)} later" if d.complete
                          else "") + f", and its {last.call} returned "
                       f"{_us(last.ts - d.posted)} after the write was posted; no interrupt of "
                       "the card came after that return",
                       excerpt_lines(tr, _with_doorbell_before(tr, d), 0, upto=last.lineno),
                       {d.seq: (f"INT_ENABLE=0 (seq={d.seq})", "")})
    pair = last_crossing(tr)
    if pair:
        a, b = pair
        return Finding("crossing", f"CPU {a.cpu} wrote doorbell {a.val} (seq={a.seq}), then CPU "
                       f"{b.cpu} wrote {b.val} (seq={b.seq}); they reached the card in order",
                       excerpt_lines(tr, pair, context_writes=0),
                       {a.seq: (f"doorbell {a.val} (seq={a.seq})", ""),
                        b.seq: (f"{b.val} (seq={b.seq})", "")})
    return None


def _with_doorbell_before(tr: Trace, w: Write) -> list[Write]:
    """w and the last doorbell posted before it (the commands still in flight)."""
    db = tr.ring.doorbell
    before = [o for o in tr.writes.values() if o.off == db and o.seq < w.seq and o.lines]
    return [max(before, key=lambda o: o.seq), w] if before else [w]


def excerpt_lines(tr: Trace, pair: Sequence[Write], context_writes: int = 1,
                  max_lines: int = 300, upto: int = 0) -> list[int]:
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


def _thinned(tr: Trace, keep: list[Write], centre: int, lines: list[int], max_lines: int
             ) -> list[int]:
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
    warnings: list[str]
    # The first screen: the finding's writes and the few around them, drawn
    # for a desktop and for a phone, and the same in words.
    focus_svg: str = ""
    focus_narrow_svg: str = ""
    words: list[str] = field(default_factory=list)
    focus_writes: int = 0   # writes on the first screen (of the excerpt's drawn() ones)
    excerpt_writes: int = 0


#: Writes drawn before and after each of the finding's writes on the first screen.
FOCUS_CONTEXT = 2
#: The width of the first screen's picture on a phone (390 px, less the page's margins).
PHONE_WIDTH = 360


def still_going(w: Write) -> bool:
    """w was posted and had not reached the card when the trace ends (still in
    its CPU's queue, or in the bridge): drawn up to the trace's end. (An
    excerpt takes each write whole, so a write in it without an arrival has
    none in the whole trace; a lost drain line alone does not make one.)"""
    return w.post is not None and w.arrive is None


def drawn(tr: Trace) -> list[Write]:
    """The writes a picture of tr draws, by seq: the complete ones, and those
    still on their way when the trace ends (a disable the call returned
    before, held in a stalled queue: the posting lab's failure)."""
    return sorted((w for w in tr.writes.values() if w.complete or still_going(w)),
                  key=lambda w: w.seq)


def trace_end(tr: Trace) -> int:
    """The time of the trace's last event, in ns (its line's timestamp, on the
    fabric's clock: Event.at_ns)."""
    return max((ev.at_ns for ev in tr.events), default=0)


def focus(tr: Trace, marked: Marked) -> Trace:
    """What the first screen shows: the writes a finding names and, for each,
    the FOCUS_CONTEXT writes drawn (drawn()) posted just before and just after
    it, with the reads and waits of that time, the late interrupts, and the
    return of a call whose interrupt disable is among them."""
    ws = drawn(tr)
    index = {w.seq: i for i, w in enumerate(ws)}
    chosen: set[int] = set()
    for seq in marked:
        if seq in index:
            i = index[seq]
            chosen.update(w.seq for w in ws[max(0, i - FOCUS_CONTEXT):i + FOCUS_CONTEXT + 1])
    if not chosen:
        return tr
    writes = {seq: tr.writes[seq] for seq in sorted(chosen)}
    lo = min(w.posted for w in writes.values())
    hi = max(trace_end(tr) if w.arrive is None else w.arrived for w in writes.values())
    returns = [r for r in tr.returns if r.disabled is not None and r.disabled.seq in chosen]
    irqs = [q for q in tr.irqs if q.late]
    spans = [sp for sp in tr.spans if sp.end >= lo and sp.start <= hi]
    return Trace(tr.header, tr.events, writes, spans, irqs, returns, tr.lost, ring=tr.ring)


def in_words(tr: Trace, marked: Marked) -> list[str]:
    """The picture as sentences, for a screen reader or a terminal: each write
    drawn, then each interrupt and return, in the order they happened."""
    ws = drawn(tr)
    if not ws:
        return []
    t0 = min([w.posted for w in ws] + [q.ts for q in tr.irqs] + [r.ts for r in tr.returns])

    def at(t: int) -> str:
        return f"+{(t - t0) / 1000:.2f} \u00b5s"
    out: list[tuple[int, str]] = []
    for w in ws:
        if still_going(w):
            out.append((w.posted, f"{'[the finding] ' if w.seq in marked else ''}seq {w.seq}: "
                        f"CPU {w.cpu} writes {w.val} to {w.reg}; posted at {at(w.posted)}, "
                        + ("still in its CPU's queue" if w.drain is None else
                           f"enters the bridge at {at(w.drained)}, still in the bridge")
                        + f" where the trace shown ends ({at(trace_end(tr))}): it had not "
                        "reached the card."))
            continue
        out.append((w.posted, f"{'[the finding] ' if w.seq in marked else ''}seq {w.seq}: "
                    f"CPU {w.cpu} writes {w.val} to {w.reg}; posted at {at(w.posted)}, enters "
                    f"the bridge at {at(w.drained)}"
                    + (" ahead of an earlier-posted write" if any(
                        o.overtaken and o.seq < w.seq and o.drained > w.drained for o in ws)
                       and w.seq in marked else "")
                    + (" behind a write posted later (overtaken)" if w.overtaken else "")
                    + f", reaches the card at {at(w.arrived)}"
                    + (" after a later doorbell (stale)" if w.stale else "") + "."))
    for q in tr.irqs:
        out.append((q.ts, f"the card's interrupt is handled on CPU {q.cpu} at {at(q.ts)}"
                    + (", after the call that disabled it had returned (late)" if q.late
                       else "") + "."))
    for r in tr.returns:
        out.append((r.ts, f"{r.task}'s {r.call} returns on CPU {r.cpu} at {at(r.ts)}."))
    return [text[0].upper() + text[1:] for _, text in sorted(out, key=lambda p: p[0])]


def summarize(tr: Trace) -> str:
    dbs = [w for w in tr.writes.values() if w.off == tr.ring.doorbell]
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
         header: Mapping[str, str] | None = None, *, ring: Ring) -> Drawing:
    """Find what a recorded trace shows, cut an excerpt around it and draw it.

    header: extra "# key: value" lines for the excerpt (after the trace's own);
    ring: the card's register map (ring(kernel source)).
    """
    tr = parse(text, ring=ring)
    warnings: list[str] = []
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
    # The lead of the fabric's clock the lines cut before the excerpt showed
    # (mmiosim.clock=skip; model()), for the excerpt's own events.
    lead = next((ev.at_ns - ev.ts_ns for ev in tr.events if ev.lineno == keep[0]), 0)
    if lead > 0:
        head["fabric_lead_ns"] = str(lead)
    left_out = sum(keep[0] <= ev.lineno <= keep[-1] for ev in tr.events) - len(keep)
    if left_out:
        head["excerpt"] += (f"; {left_out} events in between left out (the writes farthest "
                            "from what it shows)")
    columns = [ln for ln in lines[:2500] if ln.startswith("#") and "TASK-PID" in ln]
    excerpt = "\n".join([f"# {k}: {v}" for k, v in head.items()] + outputs + columns[-1:]
                        + [lines[i - 1] for i in keep]) + "\n"
    try:
        cut = parse(excerpt, ring=ring)
        svg = render_svg(cut, title=title, width=width, ident=ident, marked=finding.marked)
        near = focus(cut, finding.marked)
        focus_svg = render_svg(near, title=title, width=width, ident=f"{ident}-f",
                               marked=finding.marked)
        narrow_svg = render_svg(near, title=title, width=PHONE_WIDTH, ident=f"{ident}-p",
                                marked=finding.marked)
    except TraceError as e:
        warnings.append(f"the excerpt cannot be drawn: {e}")
        return Drawing("", excerpt, finding, summary, warnings)
    return Drawing(svg, excerpt, finding, summary, warnings, focus_svg, narrow_svg,
                   in_words(near, finding.marked),
                   len(drawn(near)), len(drawn(cut)))


def html_page(d: Drawing, title: str) -> str:
    """A page for the browser: what the run shows, in a sentence and on the
    first screen (the finding's writes and the few around them, drawn for the
    screen's width); the same in words; then the whole excerpt, folded away,
    to scroll through; then the trace lines."""
    warn = "".join(f"<p class='warn'>Warning: {_e(w)}</p>" for w in d.warnings)
    shows = d.finding.text if d.finding else "nothing to draw"
    bad = d.finding is not None and d.finding.failure
    body = ""
    if d.focus_svg:
        body += (f"<figure class='focus'><div class='wide'>{d.focus_svg}</div>"
                 f"<div class='narrow'>{d.focus_narrow_svg}</div><figcaption>"
                 + ("The writes the sentence names, highlighted, and the writes posted just "
                    "before and after them"
                    + (f" ({d.focus_writes} of the excerpt's {d.excerpt_writes} writes: the "
                       "whole excerpt is below)" if d.focus_writes < d.excerpt_writes else "")
                    if d.finding and d.finding.marked else "The excerpt")
                 + ". Hover over a write for its times.</figcaption></figure>")
    body += f"<p>{_e(d.summary)}.</p>{warn}"
    if d.words:
        body += ("<details class='words'><summary>The picture in words</summary><ol>"
                 + "".join(f"<li>{_e(s)}</li>" for s in d.words) + "</ol></details>")
    if d.svg and (not d.focus_svg or d.focus_writes < d.excerpt_writes):
        body += (f"<details class='whole'><summary>The whole excerpt: {d.excerpt_writes} "
                 "writes (runs that waited together are one bar; scroll sideways)</summary>"
                 f"<div class='scroll'>{d.svg}</div></details>")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>"
            "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:1.5em;color:#222;max-width:1000px}"
            "h1{overflow-wrap:anywhere}figure{margin:0}svg{display:block}"
            ".wide svg{max-width:100%;height:auto}.narrow{display:none}"
            ".scroll{overflow-x:auto}figcaption{font-size:13px;color:#555}"
            "summary{cursor:pointer;margin:.6em 0}"
            "pre{font-size:11px;background:#f6f6f6;padding:.8em;overflow-x:auto}"
            ".shows{font-size:15px}.bad{color:#b00020}.warn{color:#b35900}"
            f"@media (max-width:{NARROW}px){{body{{margin:.6em}}.wide{{display:none}}"
            ".narrow{display:block}}"
            "</style></head><body>"
            f"<h1>{_e(title)}</h1>"
            f"<p class='shows{' bad' if bad else ''}'><b>{'Found' if bad else 'Shows'}:</b> "
            f"{_e(shows)}.</p>{body}"
            f"<h2>The excerpt of the trace</h2><pre>{_e(d.excerpt)}</pre></body></html>\n")


# --- drawing -----------------------------------------------------------------

CPU_COLOURS = ["#1f5fa8", "#b35900", "#2e7d32", "#6a1b9a"]
CPU_FILLS = ["#dbe7f5", "#f6e2cc", "#dcefdc", "#eadcf2"]
RED = "#b00020"
GREY = "#888888"


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _f(v: float) -> str:
    """A coordinate, to a tenth of a pixel."""
    return f"{v:.1f}"


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs: object) -> ET.Element:
    """A child element; an attribute name's underscores become hyphens
    (class_ is class): stroke_width="3" is stroke-width="3"."""
    el = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v)
                                     for k, v in attrs.items()})
    if text is not None:
        el.text = text
    return el


def _nice_step(span_us: float, target: int = 8) -> float:
    """A tick step of 1, 2, 2.5 or 5 times a power of ten (at least 0.1 µs),
    giving about target ticks: a 65 ms stall's axis reads 0, 20000, 40000,
    not 0, 23102.8, 46205.6."""
    raw = span_us / target
    decade = 0.1
    while True:
        for m in (1, 2, 2.5, 5):
            if m * decade >= raw:
                return round(m * decade, 1)
        decade *= 10


def _place_rows(items: list[Write | _Group], rows: list[int], row_of: dict[int, int], groups: list[_Group],
                group_of: dict[int, _Group]) -> None:
    """Each item's row into row_of (by seq; a folded group's row for each of its
    writes), and the groups into groups and group_of (a lane's queue or the
    bridge: the same bookkeeping)."""
    for it, r in zip(items, rows):
        if isinstance(it, _Group):
            groups.append(it)
            for w in it.writes:
                row_of[w.seq] = r
                group_of[w.seq] = it
        else:
            row_of[it.seq] = r


def _rows(intervals: Iterable[tuple[float, float]]) -> tuple[list[int], int]:
    """Greedy sub-row assignment so that bars in one lane do not overlap."""
    ends: list[float] = []
    out: list[int] = []
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


# --- text: widths, and labels that never overlap ------------------------------

# Advance widths in em of DejaVu Sans, the pictures' first font, rounded up by
# class of character (digits are 0.636, most lower case 0.52-0.63, "il" 0.28,
# capitals 0.6-0.78); DejaVu Sans Mono's is 0.602 for every character. They
# place the labels; tests/test_race_picture.py checks the result with the
# boxes Chromium lays out, not with these.
_NARROW, _MID, _WIDE = set("il.,:;'|!I "), set("fjtr()[]-=/"), set("mwMW%\u2026")
Box = tuple[float, float, float, float]     # x0, y0, x1, y1
MONO_EM = 0.61


def text_width(s: str, size: float, mono: bool = False, bold: bool = False) -> float:
    """The width of s in pixels, at font-size size, a little over the real one."""
    if mono:
        return len(s) * MONO_EM * size
    em = sum(0.33 if c in _NARROW else 0.43 if c in _MID else 1.0 if c in _WIDE else
             0.78 if c.isupper() else 0.65 for c in s)
    return em * size * (1.12 if bold else 1.0)


class _Labels:
    """Where the picture's text goes: each label at the first of its candidate
    places where it stays inside its region (by default the picture) and
    overlaps no label placed before it; a label with no such place is left
    out (what it says is in its item's tooltip and in the text version).
    Labels are placed in order of importance: the finding's first.

    An item's labels are drawn in layer (put last in the picture, over every
    line and bar: a later write's lines would otherwise cross an earlier
    write's label), in a group of their own that carries the item's classes
    after its first (mmiosim-write marked: mmiosim-labels marked) and its
    tooltip; the frame's, the axis' and the legend's stay where they are."""

    PAD = 1.5

    def __init__(self, width: float, height: float, layer: ET.Element | None = None):
        self.width, self.height = width, height
        self.boxes: list[Box] = []
        self.dropped = 0
        self.layer = layer
        self.root: ET.Element | None = None      # the drawing's group: labels stay in it
        self.groups: dict[int, ET.Element] = {}  # id(item) -> its labels' group

    def _parent(self, item: ET.Element) -> ET.Element:
        if self.layer is None or item is self.root or item.tag != "g" \
                or not item.get("class"):
            return item
        g = self.groups.get(id(item))
        if g is None:
            cls = " ".join(["mmiosim-labels"] + (item.get("class") or "").split()[1:])
            g = self.groups[id(item)] = _el(self.layer, "g", class_=cls)
            tip = item.find("title")
            if tip is not None:
                _el(g, "title", tip.text)
        return g

    def box(self, text: str, x: float, y: float, anchor: str, size: float, mono: bool,
            bold: bool) -> Box:
        w = text_width(text, size, mono, bold)
        x0 = x - w if anchor == "end" else x - w / 2 if anchor == "middle" else x
        return (x0, y - 0.95 * size, x0 + w, y + 0.27 * size)

    def free(self, b: Box, region: Box | None = None) -> bool:
        rx0, ry0, rx1, ry1 = region or (0, 0, self.width, self.height)
        p = self.PAD
        if b[0] < rx0 + 1 or b[1] < ry0 or b[2] > rx1 - 1 or b[3] > ry1:
            return False
        return not any(b[0] < o[2] + p and o[0] < b[2] + p and b[1] < o[3] + p
                       and o[1] < b[3] + p for o in self.boxes)

    def place(self, parent: ET.Element, text: str, candidates: Sequence[tuple[float, float, str]],
              size: float = 11.0, mono: bool = False, bold: bool = False,
              region: Box | None = None, cls: str = "", style: str = "",
              required: bool = False) -> ET.Element | None:
        """Draw text at the first free candidate (x, y, anchor); required text
        (lane names, the axis) goes at the first candidate whatever it meets.
        Returns the element, or None when the label was left out."""
        for x, y, anchor in candidates:
            b = self.box(text, x, y, anchor, size, mono, bold)
            if self.free(b, region):
                break
        else:
            if not required:
                self.dropped += 1
                return None
            x, y, anchor = candidates[0]
            b = self.box(text, x, y, anchor, size, mono, bold)
        self.boxes.append(b)
        attrs: dict[str, object] = {"x": _f(x), "y": _f(y)}
        if anchor != "start":
            attrs["text_anchor"] = anchor
        if cls:
            attrs["class_"] = cls
        if style:
            attrs["style"] = style
        return _el(self._parent(parent), "text", text, **attrs)


def _wrap(text: str, width: float, size: float) -> list[str]:
    """text in lines no wider than width (estimated) at font-size size."""
    lines: list[str] = []
    cur = ""
    for word in text.split():
        cand = f"{cur} {word}" if cur else word
        if cur and text_width(cand, size) > width:
            lines.append(cur)
            cur = word
        else:
            cur = cand
    return lines + [cur] if cur else lines


# --- layout --------------------------------------------------------------------

#: Runs of at least this many writes that wait together (in one CPU's queue, or
#: in the bridge) are drawn as one labelled group.
FOLD_MIN = 4
#: Below this width the picture is drawn for a phone: a narrower margin and
#: shorter lane captions.
NARROW = 600


@dataclass
class _Group:
    """Writes drawn as one bar: a stalled queue, or a burst in the bridge."""
    writes: list[Write]
    lo: int                 # ns
    hi: int                 # ns
    where: str              # "queue" or "bridge"

    @property
    def first(self) -> Write:
        return self.writes[0]

    def title(self) -> str:
        ws = self.writes
        what = ("queued together on CPU " + str(ws[0].cpu) if self.where == "queue"
                else "in the bridge together")
        vals = ", ".join(f"{w.reg}={w.val}" for w in ws[:12]) + (", \u2026" if len(ws) > 12
                                                                  else "")
        return (f"{len(ws)} writes {what} (seq {ws[0].seq}-{ws[-1].seq}): {vals}; "
                f"{sum(w.overtaken for w in ws)} overtaken, {sum(w.stale for w in ws)} stale")


def _fold(writes: list[Write], start: Callable[[Write], int], end: Callable[[Write], int],
          keep: set[int], where: str) -> list[Write | _Group]:
    """Split writes (in the order they queue) into singles and groups: a group
    is a run of at least FOLD_MIN of them, none in keep, each of which starts
    (start(w)) before the run so far has ended (end(w)): they wait together.
    Returns a list of Writes and _Groups."""
    out: list[Write | _Group] = []
    run: list[Write] = []
    run_end = 0             # when the run so far ends (read only while it holds writes)

    def close() -> None:
        if len(run) >= FOLD_MIN:
            out.append(_Group(list(run), min(start(w) for w in run),
                              max(end(w) for w in run), where))
        else:
            out.extend(run)
        run.clear()

    for w in writes:
        if w.seq in keep:
            close()
            out.append(w)
            continue
        if run and start(w) < run_end:
            run.append(w)
            run_end = max(run_end, end(w))
        else:
            close()
            run.append(w)
            run_end = end(w)
    close()
    return out


# A lane of the picture: (key, label, sub-label, y of its top, height).
Lane = tuple[tuple[str, int], str, str, int, int]
# The legend: rows of swatches (colour, text, x), and the notes' lines.
Legend = tuple[list[list[tuple[str, str, float]]], list[str]]


@dataclass
class _Layout:
    """Where everything of a timeline goes: the events drawn, the time scale
    (x() maps nanoseconds to pixels), the lanes and their sub-rows."""
    writes: list[Write]
    spans: list[Span]
    irqs: list[Irq]
    rets: list[Return]
    cpus: list[int]
    t0: int
    lo_ns: float
    hi_ns: float
    left: int
    right: int
    width: int
    q_rows: dict[int, int]      # seq -> sub-row in its CPU's lane
    b_rows: dict[int, int]      # seq -> sub-row in the bridge
    q_groups: list[_Group]      # _Group (queue)
    b_groups: list[_Group]      # _Group (bridge)
    q_group_of: dict[int, _Group]   # seq -> its queue _Group
    b_group_of: dict[int, _Group]   # seq -> its bridge _Group
    due: dict[int, int]
    row_h: int
    lanes: list[Lane]           # (key, label, sub, y_top, height)
    lane: dict[tuple[str, int], tuple[int, int]]
    axis_y: int
    legend: Legend              # (items [(colour, text, x)], notes [line])
    legend_y: int
    height: int
    narrow: bool
    marked: Marked              # seq -> (queue label, bridge label): the finding's writes
    title_lines: list[str]
    # seq -> "queue" or "bridge": where a write still on its way when the
    # trace ends is then (drawn up to the end, not to the card)
    going: dict[int, str] = field(default_factory=dict)

    def x(self, t: float) -> float:
        return self.left + (t - self.lo_ns) / (self.hi_ns - self.lo_ns) * \
            (self.width - self.left - self.right)


def render_svg(tr: Trace, title: str = "", width: int = 960, ident: str = "tl",
               doorbell: int | None = None, marked: Marked | None = None) -> str:
    """An SVG timeline of the trace's complete writes, reads and mmiowb() waits
    (doorbell: the register drawn as the doorbell, by default the card's), built
    as an ElementTree (which escapes every text and attribute).

    marked: seq -> (label on its queue, label in the bridge) for the writes a
    finding names, highlighted and labelled first; runs of other writes that
    wait together are folded into one labelled bar."""
    doorbell = tr.ring.doorbell if doorbell is None else doorbell
    L = _layout(tr, title, width, marked or {}, doorbell)
    layer = ET.Element("g", {"class": "mmiosim-text"})
    labels = _Labels(L.width, L.height, layer)
    svg, g, arrow = _draw_frame(L, title, ident, labels)
    labels.root = g
    _draw_axis(g, L, labels)
    _draw_legend(g, L, labels)
    _draw_writes(g, L, arrow, doorbell, labels)
    _draw_spans(g, L, labels)
    _draw_interrupts(g, L, labels)
    g.append(layer)
    return ET.tostring(svg, encoding="unicode")


def _queue_label(w: Write, doorbell: int, disables: set[int]) -> str:
    return (f"{w.val}" if w.off == doorbell else f"{w.reg}={w.val}" if w.seq in disables
            else w.reg)


def _layout(tr: Trace, title: str, width: int, marked: Marked, doorbell: int) -> _Layout:
    """Lay out the trace's drawn() writes and what happened around them;
    TraceError if there is none or their times are out of order. A write
    still on its way when the trace ends is laid out as one whose drain (if
    it has none) and arrival come at the trace's end; going says which."""
    end = trace_end(tr)
    going = {w.seq: "queue" if w.drain is None else "bridge"
             for w in tr.writes.values() if still_going(w)}
    writes = [dataclasses.replace(w, drain=max(end, w.posted) if w.drain is None else w.drain,
                                  arrive=max(end, w.posted, w.drain or 0))
              if w.seq in going else w for w in drawn(tr)]
    if len(writes) < 1:
        raise TraceError("no write has a post, a drain and an arrival in this trace")
    bad = [w for w in writes if not (w.posted <= w.drained <= w.arrived)]
    if bad:
        w = bad[0]
        raise TraceError(
            f"write seq={w.seq}: post {w.post} ns, drain {w.drain} ns, arrival {w.arrive} ns "
            "are out of order: was the trace recorded with trace_clock 'mono' "
            "(scripts/trace-timeline sets it)?")
    spans = [s for s in tr.spans if s.end >= writes[0].posted and s.start <= writes[-1].arrived]
    card = tr.card_irq
    irqs = [q for q in tr.irqs if card is None or q.irq == card]
    rets = [r for r in tr.returns if r.disabled is not None]
    marks = [q.ts for q in irqs] + [r.ts for r in rets]
    cpus = sorted({w.cpu for w in writes} | {s.cpu for s in spans} | {q.cpu for q in irqs}
                  | {r.cpu for r in rets})
    t0 = min([w.posted for w in writes] + [s.start for s in spans] + marks)
    t1 = max([w.arrived for w in writes] + [s.end for s in spans] + marks)
    span_ns = max(t1 - t0, 1000)
    narrow = width < NARROW
    left, right = (78 if narrow else 118), (12 if narrow else 24)
    plot_w = width - left - right
    pad = span_ns * 0.03
    lo_ns, hi_ns = t0 - pad, t1 + pad

    def x(t: float) -> float:
        return left + (t - lo_ns) / (hi_ns - lo_ns) * plot_w

    disables = {r.disable_write.seq for r in rets}
    keep = set(marked)

    def qlabel_w(w: Write) -> float:
        text = marked[w.seq][0] if w.seq in marked else _queue_label(w, doorbell, disables)
        return text_width(text, 11, mono=True) + 8

    # Lanes and sub-rows: a stalled queue is one group, one row.
    q_rows: dict[int, int] = {}
    q_n: dict[int, int] = {}
    q_groups: list[_Group] = []
    q_group_of: dict[int, _Group] = {}
    for c in cpus:
        items = _fold([w for w in writes if w.cpu == c], lambda w: w.posted, lambda w: w.drained,
                      keep, "queue")
        spans_x = []
        for it in items:
            if isinstance(it, _Group):
                spans_x.append((x(it.lo) - text_width(f"{len(it.writes)} queued", 11) - 8,
                                x(it.hi) + 4))
            else:
                spans_x.append((x(it.posted) - qlabel_w(it), x(it.drained) + 4))
        rows, n = _rows(spans_x)
        _place_rows(items, rows, q_rows, q_groups, q_group_of)
        q_n[c] = n
    b_order = sorted(writes, key=lambda w: (w.drain, w.seq))
    # When each write was due at the device: bridge_ns after it entered the
    # bridge, and not before the write ahead of it (the bridge is a FIFO).
    # The fabric delivers a due write at the next access or when its timer
    # fires, so the recorded arrival can be later.
    bridge_ns = fabric_param(tr.header.get("fabric", ""), "bridge_ns")
    due: dict[int, int] = {}
    tail = 0
    for w in b_order:
        tail = due[w.seq] = min(max(w.drained + bridge_ns, tail), w.arrived)
    items = _fold(b_order, lambda w: w.drained, lambda w: w.arrived, keep, "bridge")
    spans_x = []
    for it in items:
        if isinstance(it, _Group):
            spans_x.append((x(it.lo) - 2, x(it.hi) + 8 + text_width(
                f"{len(it.writes)} in the bridge", 11)))
        else:
            extra = text_width(marked.get(it.seq, ("", "overtaken"))[1] or "", 11, bold=True) \
                if (it.overtaken or it.seq in marked) else 0
            spans_x.append((x(it.drained) - 2, max(x(it.arrived) + 2, x(it.drained) + extra + 6)))
    rows, b_n = _rows(spans_x)
    b_rows: dict[int, int] = {}
    b_groups: list[_Group] = []
    b_group_of: dict[int, _Group] = {}
    _place_rows(items, rows, b_rows, b_groups, b_group_of)
    row_h = 15
    lanes: list[Lane] = []
    title_lines = _wrap(title, width - 24, 13 * 1.12) if title else []
    y = 40 + 17 * (len(title_lines) - 1) if title else 14
    for c in cpus:
        h = 44 + q_n.get(c, 1) * row_h
        lanes.append((("cpu", c), f"CPU {c}", "queue" if narrow else "posted-write queue", y, h))
        y += h
    h = 34 + b_n * row_h
    lanes.append((("bridge", 0), "I/O bridge" if not narrow else "Bridge",
                  "FIFO" if narrow else "one FIFO, in order", y, h))
    y += h
    lanes.append((("device", 0), "Device", "ring card", y, 70))
    y += 70
    lane = {k: (top, hgt) for k, _, _, top, hgt in lanes}
    axis_y = y + 8
    caption_lines = len(_wrap(_axis_caption(t0), width - 20, 10.5))
    legend_y = axis_y + 34 + 13 * caption_lines
    legend = _legend(cpus, bool(irqs or rets), bool(marked), width, narrow, bool(going))
    height = legend_y + 16 * len(legend[0]) + 13 * len(legend[1]) + 14
    L = _Layout(writes, spans, irqs, rets, cpus, t0, lo_ns, hi_ns, left, right, width, q_rows,
                b_rows, q_groups, b_groups, q_group_of, b_group_of, due, row_h, lanes, lane,
                axis_y, legend, legend_y, height, narrow, marked, title_lines, going)
    return L


def _axis_caption(t0: int) -> str:
    return f"time since the first event shown, \u00b5s (the fabric's clock; t0 = {t0} ns)"


def _legend(cpus: list[int], irqs: bool, marked: bool, width: int, narrow: bool,
            going: bool = False) -> Legend:
    """The legend's swatches, in rows that fit the width, and its notes, wrapped."""
    items = [(CPU_COLOURS[c % 4], f"CPU {c}: doorbell write") for c in cpus]
    items += [(GREY, "other register write"),
              (RED, "overtaken / stale / late" if irqs else "overtaken / stale")]
    if marked:
        items.append((HIGHLIGHT, "the writes the finding names"))
    x0 = 10
    rows: list[list[tuple[str, str, float]]] = []
    row: list[tuple[str, str, float]] = []
    lx: float = x0
    for colour, text in items:
        w = 27 + text_width(text, 10.5) + 10
        if row and lx + w > width - 10:
            rows.append(row)
            row, lx = [], x0
        row.append((colour, text, lx))
        lx += w
    if row:
        rows.append(row)
    note = ("Each write: a dot when its CPU posts it, a bar while it waits in its CPU's queue, "
            "a bar while it crosses the bridge (dotted once it is due at the device, until the "
            "fabric delivers it), a dot when it arrives. A doorbell's number is the producer "
            "index it carries. Boxes on a CPU's lane: mmiowb() waiting (dashed), readl() "
            "round trips. Writes that wait together (a stalled queue, a burst in the bridge) "
            "are one grey bar, with how many; hover for what they were.")
    if going:
        note += (" A bar that ends in an arrow: the write had not reached the card where the "
                 "trace shown ends.")
    if irqs:
        note += (" Triangles: the card's interrupt handler starts on that CPU (late: after the "
                 "call that disabled it had returned, dashed line).")
    return rows, _wrap(note, width - 20, 10.5)


HIGHLIGHT = "#ffcc33"


def _draw_frame(L: _Layout, title: str, ident: str, labels: _Labels
                ) -> tuple[ET.Element, ET.Element, Callable[[str], str]]:
    """The svg element, its title, description, style and arrow heads, the
    lanes' backgrounds and labels: (svg, the group to draw in, arrow(colour))."""
    svg = ET.Element("svg", {"xmlns": "http://www.w3.org/2000/svg", "class": "mmiosim-timeline",
                             "width": str(L.width), "height": str(L.height),
                             "viewBox": f"0 0 {L.width} {L.height}", "role": "img",
                             "aria-labelledby": f"{ident}-title {ident}-desc"})
    n_over = sum(w.overtaken for w in L.writes)
    n_stale = sum(w.stale for w in L.writes)
    folded = sum(len(g.writes) for g in L.q_groups + L.b_groups)
    desc = (f"{len(L.writes)} writes traced on CPUs {', '.join(map(str, L.cpus))}, from post to "
            f"arrival; {n_over} overtaken in the bridge, {n_stale} stale doorbells; "
            f"{sum(s.kind == 'mmiowb' for s in L.spans)} mmiowb() waits, "
            f"{sum(s.kind == 'read' for s in L.spans)} reads."
            + (f" {len(L.q_groups)} stalled queues and {len(L.b_groups)} bursts in the bridge "
               "are drawn as one bar each." if folded else "")
            + (f" {len(L.going)} had not reached the card where the trace shown ends."
               if L.going else ""))
    _el(svg, "title", title or "Recorded mmiosim trace", id=f"{ident}-title")
    _el(svg, "desc", desc, id=f"{ident}-desc")
    _el(svg, "style",
        f"#{ident} text{{font-family:'DejaVu Sans',Arial,sans-serif;font-size:11px;fill:#333}}"
        f"#{ident} .row{{font-size:13px;font-weight:bold;fill:#222}}"
        f"#{ident} .sub{{font-size:10.5px;fill:#666}}"
        f"#{ident} .code{{font-family:'DejaVu Sans Mono',monospace;font-size:11px}}"
        f"#{ident} .ttl{{font-size:13px;font-weight:bold}}"
        # A white halo: a label stays legible where it crosses a line.
        f"#{ident} .mmiosim-text text{{paint-order:stroke;stroke:#fff;stroke-width:3px;"
        "stroke-linejoin:round}")
    g = _el(svg, "g", id=ident)
    palette = CPU_COLOURS + [GREY, RED]
    defs = _el(g, "defs")
    for i, c in enumerate(palette):
        marker = _el(defs, "marker", id=f"{ident}-arr{i}", viewBox="0 0 10 10", refX="9",
                     refY="5", markerWidth="6", markerHeight="6", orient="auto")
        _el(marker, "path", d="M0,0 L10,5 L0,10 z", fill=c)

    def arrow(colour: str) -> str:
        return f"url(#{ident}-arr{palette.index(colour)})"
    _el(g, "rect", x=0, y=0, width=L.width, height=L.height, fill="white")
    for i, line in enumerate(L.title_lines):
        labels.place(g, line, [(12, 22 + 17 * i, "start")], 13, bold=True, cls="ttl",
                     required=True)
    for i, (key, label, sub, top, hgt) in enumerate(L.lanes):
        if i % 2 == 0:
            _el(g, "rect", x=0, y=top, width=L.width, height=hgt, fill="#f7f7f7")
        colour = CPU_COLOURS[key[1] % 4] if key[0] == "cpu" else "#222"
        labels.place(g, label, [(8, top + 20, "start")], 13, bold=True, cls="row",
                     style=f"fill:{colour}", required=True)
        labels.place(g, sub, [(8, top + 34, "start")], 10.5, cls="sub", required=True)
    return svg, g, arrow


def _us_text(t_us: float) -> str:
    """A tick's number: tenths at most, never an exponent (a 2.5 s axis reads
    2500000, as the caption's unit is µs, not 2.5e+06)."""
    return f"{t_us:.1f}".rstrip("0").rstrip(".")


def _draw_axis(g: ET.Element, L: _Layout, labels: _Labels) -> None:
    # Time axis, in microseconds from the first event shown; ticks far enough
    # apart for their numbers.
    plot_w = L.width - L.left - L.right
    step_us = _nice_step((L.hi_ns - L.lo_ns) / 1000, target=max(2, int(plot_w // 80)))
    _el(g, "line", x1=L.left, y1=L.axis_y, x2=L.width - L.right, y2=L.axis_y, stroke="#888")
    k = 0
    while True:
        t_us = k * step_us
        tx = L.x(L.t0 + t_us * 1000)
        if tx > L.width - L.right + 0.5:
            break
        _el(g, "line", x1=_f(tx), y1=L.lanes[0][3], x2=_f(tx), y2=L.axis_y, stroke="#e3e3e3")
        _el(g, "line", x1=_f(tx), y1=L.axis_y, x2=_f(tx), y2=L.axis_y + 5, stroke="#888")
        labels.place(g, _us_text(t_us), [(tx, L.axis_y + 17, "middle"),
                                      (L.width - 2, L.axis_y + 17, "end")])
        k += 1
    for i, line in enumerate(_wrap(_axis_caption(L.t0), L.width - 20, 10.5)):
        labels.place(g, line, [(L.width - 10, L.axis_y + 31 + 13 * i, "end")], 10.5,
                     cls="sub", required=True)


def _draw_spans(g: ET.Element, L: _Layout, labels: _Labels) -> None:
    # mmiowb() waits and reads on their CPU's lane.
    for s in L.spans:
        top, hgt = L.lane[("cpu", s.cpu)]
        x0, x1 = L.x(s.start), max(L.x(s.end), L.x(s.start) + 2)
        colour = CPU_COLOURS[s.cpu % 4]
        yb = top + hgt - 16
        cls = "mmiosim-mmiowb" if s.kind == "mmiowb" else "mmiosim-read"
        label = "mmiowb()" if s.kind == "mmiowb" else "readl()"
        item = _el(g, "g", class_=cls)
        _el(item, "title", f"{s.detail} (trace line {s.lineno})")
        _el(item, "rect", x=_f(x0), y=yb, width=_f(x1 - x0), height=11, rx=2, fill="white",
            stroke=colour, stroke_dasharray="3 2" if s.kind == "mmiowb" else "none")
        labels.place(item, label, [((x0 + x1) / 2, yb + 9, "middle"), (x1 + 3, yb + 9, "start"),
                                   (x0 - 3, yb + 9, "end")], 9, mono=True, cls="code",
                     style=f"font-size:9px;fill:{colour}",
                     region=(0, top, L.width, top + hgt))


def _draw_interrupts(g: ET.Element, L: _Layout, labels: _Labels) -> None:
    # Interrupt handlers (a triangle where one starts) and the return of the
    # call that disabled the card's interrupts (a line across its CPU's lane).
    for r in L.rets:
        top, hgt = L.lane[("cpu", r.cpu)]
        xr = L.x(r.ts)
        colour = CPU_COLOURS[r.cpu % 4]
        item = _el(g, "g", class_="mmiosim-return")
        _el(item, "title", f"{r.task}: {r.call} returns (it posted INT_ENABLE=0, seq "
            f"{r.disable_write.seq}; trace line {r.lineno})")
        _el(item, "line", x1=_f(xr), y1=top + 2, x2=_f(xr), y2=top + hgt - 2, stroke=colour,
            stroke_width="1.5", stroke_dasharray="4 2")
        labels.place(item, f"{r.call} returns", [(xr + 3, top + 11, "start"),
                                                 (xr - 3, top + 11, "end")], 9.5, mono=True,
                     cls="code", style=f"font-size:9.5px;fill:{colour}",
                     region=(0, top, L.width, top + hgt))
    # The late ones first: their labels are the ones that must not be left out.
    for q in sorted(L.irqs, key=lambda q: not q.late):
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
        labels.place(item, label, [(xq, top + 23, "middle"), (xq + 6, top + 11, "start"),
                                   (xq - 6, top + 11, "end")], 9.5, mono=True, bold=q.late,
                     cls="code", style=f"font-size:9.5px;fill:{colour}"
                     + (";font-weight:bold" if q.late else ""),
                     region=(0, top, L.width, top + hgt))


def _draw_writes(g: ET.Element, L: _Layout, arrow: Callable[[str], str], doorbell: int,
                 labels: _Labels) -> None:
    dev_top, dev_h = L.lane[("device", 0)]
    b_top, b_h = L.lane[("bridge", 0)]
    dev_region = (0, dev_top, L.width, dev_top + dev_h)
    dy = dev_top + 16
    # The interrupt disables whose call returned (and those a late interrupt followed).
    disables = {r.disable_write.seq for r in L.rets}
    too_late = {r.disable_write.seq for r in L.rets
                if any(q.late and q.lineno > r.lineno for q in L.irqs)
                or r.disable_write.arrive is None or r.disable_write.arrived > r.ts}

    def qy(w: Write) -> int:
        top, _ = L.lane[("cpu", w.cpu)]
        return top + 26 + L.q_rows[w.seq] * L.row_h

    def by(w: Write) -> int:
        return b_top + 24 + L.b_rows[w.seq] * L.row_h

    # The finding's writes first (their labels are placed before any other),
    # then the rest in order.
    order = sorted(L.writes, key=lambda w: (w.seq not in L.marked, w.seq))
    said: set[tuple[str, int]] = set()     # the lanes whose writes still going are labelled
    for w in order:
        is_db = w.off == doorbell
        is_off = w.seq in disables
        colour = CPU_COLOURS[w.cpu % 4] if is_db or is_off else GREY
        hot = RED if (w.overtaken or w.stale or w.seq in too_late) else colour
        top, hgt = L.lane[("cpu", w.cpu)]
        qg, bg = L.q_group_of.get(w.seq), L.b_group_of.get(w.seq)
        wy, wb = qy(w), by(w)
        xp, xd, xa = L.x(w.posted), L.x(w.drained), L.x(w.arrived)
        reg = w.reg
        mark = L.marked.get(w.seq)
        classes = "mmiosim-write" + (" doorbell" if is_db else "") + \
            (" overtaken" if w.overtaken else "") + (" stale" if w.stale else "") + \
            (" marked" if mark else "") + (" folded" if qg or bg else "")
        # A post time taken from the line (no posted=) may be a little late.
        post_ts = w.posted if w.post_ts is None else w.post_ts
        late = post_ts - w.posted > 1000
        going = L.going.get(w.seq)
        ends = f"where the trace shown ends (+{(w.arrived - L.t0) / 1000:.2f} \u00b5s)"
        tip = (f"seq {w.seq}: CPU {w.cpu} writes {w.val} to {reg} (win {w.win}); "
               f"posted at +{(w.posted - L.t0) / 1000:.2f} \u00b5s"
               + (" or a little earlier (its trace line, recorded after the fabric delivered "
                  f"earlier writes, says +{(post_ts - L.t0) / 1000:.2f} \u00b5s)" if late else "")
               + (f", still in its CPU's queue {ends}: it had not reached the card"
                  if going == "queue" else
                  f", enters the bridge at +{(w.drained - L.t0) / 1000:.2f} \u00b5s"
                  + (" behind a write posted later (overtaken)" if w.overtaken else "")
                  + (f", still in the bridge {ends}: it had not reached the card"
                     if going else f", arrives at +{(w.arrived - L.t0) / 1000:.2f} \u00b5s")
                  + (" after a later doorbell (stale)" if w.stale else "")))
        item = _el(g, "g", class_=classes, data_seq=w.seq, data_cpu=w.cpu,
                   data_off=f"{w.off:#x}", data_val=w.val)
        _el(item, "title", tip)
        thick, thin = ("3", "1.6") if is_db else ("1.5", "1")
        xu = L.x(L.due[w.seq])
        dev_y = dy
        if mark:
            # A halo under the whole path of a write the finding names (as far
            # as it went).
            path = f"M{_f(xp)},{wy} L{_f(xd)},{wy}" + (
                "" if going == "queue" else f" L{_f(xd)},{wb} L{_f(xa)},{wb}"
                + ("" if going else f" L{_f(xa)},{dev_y}"))
            _el(item, "path", d=path, fill="none", stroke=HIGHLIGHT, stroke_width="9",
                stroke_opacity="0.6", stroke_linejoin="round", stroke_linecap="round")
        # queued on its CPU: post -> drain (a group draws one bar for all)
        _el(item, "circle", cx=_f(xp), cy=wy, r=("3.5" if is_db else "2.5") if not qg else "1.5",
            fill=colour)
        if not qg:
            _el(item, "line", x1=_f(xp), y1=wy, x2=_f(xd), y2=wy, stroke=colour,
                stroke_width=thick, stroke_opacity="0.55",
                **({"marker_end": arrow(colour)} if going == "queue" else {}))
            text = mark[0] if mark else _queue_label(w, doorbell, disables)
            weight = ";font-weight:bold" if mark else ""
            labels.place(item, text, [(xp - 5, wy + 4, "end"), (xd + 5, wy + 4, "start"),
                                      (xp, wy - 5, "start")], 11, mono=True, bold=bool(mark),
                         cls="code", style=f"fill:{colour}{weight}",
                         region=(0, top + 14, L.width, top + hgt))
        lane_key = ("cpu", w.cpu) if going == "queue" else ("bridge", 0)
        if going and lane_key not in said:
            # Once a lane (the finding's write first): the arrows say it for the rest.
            said.add(lane_key)
            _draw_going(item, L, labels, w, lane_key, wy if going == "queue" else wb, hot)
        if going == "queue":
            continue
        # into the bridge
        _el(item, "line", x1=_f(xd), y1=wy, x2=_f(xd), y2=wb, stroke=hot,
            stroke_width=thin if not (qg or bg) else "0.8",
            **({} if (qg or bg) else {"marker_end": arrow(hot)}))
        # in the bridge: drain -> due (solid), due -> delivered (dotted)
        if not bg:
            _el(item, "line", x1=_f(xd), y1=wb, x2=_f(xu), y2=wb, stroke=hot, stroke_width=thick,
                stroke_opacity="0.55")
            if xa - xu > 1:
                _el(item, "line", x1=_f(xu), y1=wb, x2=_f(xa), y2=wb, stroke=hot,
                    stroke_width=thin, stroke_dasharray="2 3",
                    **({"marker_end": arrow(hot)} if going else {}))
            btext = mark[1] if mark and mark[1] else "overtaken" if w.overtaken else ""
            if btext:
                # Beside where it entered the bridge, else anywhere above or
                # below its bar (a phone's picture has little room).
                labels.place(item, btext, [(xd + 4, wb - 4, "start"), (xd - 4, wb - 4, "end"),
                                           (xa + 4, wb + 4, "start"),
                                           (L.width - 4, wb - 4, "end"),
                                           (xd + 4, wb + 13, "start"), (xd - 4, wb + 13, "end"),
                                           (L.width - 4, wb + 13, "end")], 11, bold=True,
                             style=f"fill:{RED if w.overtaken else colour};font-weight:bold",
                             region=(0, b_top + 2, L.width, b_top + b_h))
        if going:
            continue
        # to the device
        _el(item, "line", x1=_f(xa), y1=wb, x2=_f(xa), y2=dev_y - 5, stroke=hot,
            stroke_width=thin if not bg else "0.8",
            **({} if bg else {"marker_end": arrow(hot)}))
        _el(item, "circle", cx=_f(xa), cy=dev_y, r=("5" if is_db else "3") if not bg else "2.5",
            fill=hot, stroke="white")
        if (is_db or is_off) and not bg:
            txt = f"sees {w.val}" + (" (stale)" if w.stale else "") if is_db else \
                "interrupts off" + (" (too late)" if w.seq in too_late else "")
            bold = w.stale or w.seq in too_late
            labels.place(item, txt, [(xa, dev_y + 18 + 13 * k, a) for k in range(3)
                                     for a in ("middle", "start", "end")], 11, mono=True,
                         bold=bold, cls="code",
                         style=f"fill:{hot}" + (";font-weight:bold" if bold else ""),
                         region=dev_region)
    _draw_groups(g, L, labels, doorbell, qy, by)


def _draw_going(item: ET.Element, L: _Layout, labels: _Labels, w: Write,
                lane: tuple[str, int], y: float, colour: str) -> None:
    """Say where a write still on its way when the trace shown ends is (its
    bar, at y, ends there in an arrow): below the bar first, as the return of
    a call at the end is labelled above its lane's first row."""
    top, hgt = L.lane[lane]
    xe = L.x(w.arrived)
    text = "still queued at the end" if lane[0] == "cpu" else "still in the bridge at the end"
    labels.place(item, text, [(xe, y + 14, "end"), (xe, y - 6, "end"),
                              (L.x(w.posted), y + 14, "start"), (L.width - 4, y + 14, "end"),
                              (L.width - 4, y - 6, "end")], 10.5, bold=True,
                 style=f"font-size:10.5px;fill:{colour};font-weight:bold",
                 region=(0, top + 2, L.width, top + hgt))


def _draw_groups(g: ET.Element, L: _Layout, labels: _Labels, doorbell: int,
                 qy: Callable[[Write], int], by: Callable[[Write], int]) -> None:
    """One bar, one label for each run of writes that waited together."""
    dev_top, dev_h = L.lane[("device", 0)]
    b_top, b_h = L.lane[("bridge", 0)]
    for grp in L.q_groups + L.b_groups:
        ws = grp.writes
        bad = any(w.overtaken or w.stale for w in ws)
        colour = RED if bad else GREY
        y = qy(grp.first) if grp.where == "queue" else by(grp.first)
        x0, x1 = L.x(grp.lo), max(L.x(grp.hi), L.x(grp.lo) + 3)
        item = _el(g, "g", class_=f"mmiosim-group {grp.where}", data_count=len(ws),
                   data_seqs=f"{ws[0].seq}-{ws[-1].seq}")
        _el(item, "title", grp.title())
        _el(item, "rect", x=_f(x0), y=y - 4, width=_f(x1 - x0), height=8, rx=3,
            fill=colour, fill_opacity="0.25", stroke=colour, stroke_width="1")
        if grp.where == "queue":
            top, hgt = L.lane[("cpu", grp.first.cpu)]
            labels.place(item, f"{len(ws)} queued", [(x0 - 5, y + 4, "end"),
                                                     (x1 + 5, y + 4, "start")], 11,
                         style=f"fill:{CPU_COLOURS[grp.first.cpu % 4]}",
                         region=(0, top + 14, L.width, top + hgt))
            continue
        labels.place(item, f"{len(ws)} in the bridge", [(x1 + 5, y + 4, "start"),
                                                        (x0 - 5, y + 4, "end")], 11,
                     style=f"fill:{colour}", region=(0, b_top + 12, L.width, b_top + b_h))
        dbs = [w for w in ws if w.off == doorbell and w.seq not in L.going]
        if dbs:
            xa = sum(L.x(w.arrived) for w in dbs) / len(dbs)
            stale = sum(w.stale for w in dbs)
            txt = (f"sees {dbs[0].val}\u2026{dbs[-1].val}" if len(dbs) > 1 else
                   f"sees {dbs[0].val}") + (f" ({stale} stale)" if stale else "")
            labels.place(item, txt, [(xa, dev_top + 34 + 13 * k, a) for k in range(3)
                                     for a in ("middle", "start", "end")], 11, mono=True,
                         cls="code", style=f"fill:{colour}",
                         region=(0, dev_top, L.width, dev_top + dev_h))


def _draw_legend(g: ET.Element, L: _Layout, labels: _Labels) -> None:
    ly = L.legend_y
    rows, notes = L.legend
    for row in rows:
        for colour, text, lx in row:
            if colour == HIGHLIGHT:
                _el(g, "line", x1=lx, y1=ly - 4, x2=lx + 22, y2=ly - 4, stroke=colour,
                    stroke_width="9", stroke_opacity="0.6")
            else:
                _el(g, "line", x1=lx, y1=ly - 4, x2=lx + 22, y2=ly - 4, stroke=colour,
                    stroke_width="3", stroke_opacity="0.7")
            labels.place(g, text, [(lx + 27, ly, "start")], 10.5, cls="sub", required=True)
        ly += 16
    for i, note in enumerate(notes):
        labels.place(g, note, [(10, ly + 2 + 13 * i, "start")], 10.5, cls="sub", required=True)


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
    out: list[Recording] = []
    cur: int | None = None
    body: list[str] = []
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
