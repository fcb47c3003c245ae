"""Read what a graded guest printed, on the host, bounded.

Everything a guest prints is shaped by the student's module: the harness
channel (KTAP lines tagged with the run's nonce, and the trace recordings
vm/record sends untagged), and the console. Every parser of it is built to
be linear (ktap.py, timeline.py: lines cut at MAX_LINE, no backtracking
patterns, recordings inflated to at most timeline.MAX_RECORDING), and the
grader still runs them all in one child bounded in time and memory
(bounded.call, as intake does), so that a parser bug or a cap we missed
costs one submission a graded, explained failure, never the batch.

read() is the step itself (also the child's body, via _child); read_bounded()
is what the grader calls.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass, field
from typing import Any

from . import bounded, ktap, model, timeline
from .lab import PROGRESS_LINE

READ_TIMEOUT = 60.0
READ_MEMORY = 1 << 30
HARNESS_INFO = "# mmiolab harness: "
# The fabric's settings as the harness reads them again after each run
# (vm/harness-lib.sh: fabric_line), and those of them that decide how
# writes are ordered: the kernel's names in its params file.
FABRIC_LINE = "# mmiolab fabric: "
# What the fabric's die notifier prints when a store to its read-only model
# faults (patches/0007: mmiosim_die()).
MODEL_STORE = "is in the fabric's model, read-only after boot"
# ... and when a store to the ring card's read-only counters faults
# (patches/0014: ringdev_die()).
COUNTERS_STORE = "is in the ring card's counters, read-only after boot"
FABRIC_SETTINGS = ("profile", "locking", "route_ns", "jitter_ns", "bridge_ns", "read_ns",
                   "stall_ns", "stall_ppm", "clock")


@dataclass
class Picture:
    text: str                   # what the trace shows, in words, and the excerpt
    html: str                   # the picture, an inline SVG, for Gradescope


@dataclass
class GuestOutput:
    """What the grader takes from one run's channel and console."""
    parsed: ktap.ParseResult
    events: list[ktap.ConsoleEvent] = field(default_factory=list)
    excerpt: str = ""           # the console excerpt a person should read
    info: str = ""              # the harness's own '# mmiolab harness: ...' line
    picture: Picture | None = None
    problem: str = ""           # why the output could not be read ('' if it was)
    fabric_changed: str = ""    # how the fabric's settings changed in the run ('' if not)


def harness_info(trusted: list[str]) -> str:
    """The rest of the first trusted '# mmiolab harness: ...' line ('' if none)."""
    for line in trusted:
        at = line.find(HARNESS_INFO)
        if at >= 0:
            return line[at + len(HARNESS_INFO):]
    return ""


def _settings(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def _changes_by_others(before: dict[str, str], now: dict[str, str]) -> str:
    """The changes of the settings the kernel counted (changes=N, sealed:
    patches/0015) beyond those the harness made since its begin line
    (harness_changes=N), in words ('' if none, or if either count is
    missing: a kernel or harness without them). A change undone before the
    settings were read again still counts."""
    try:
        counted = int(now["changes"]) - int(before["changes"])
        made = int(now["harness_changes"])
    except (KeyError, ValueError):
        return ""
    if counted == made:
        return ""
    return (f"{counted} change(s) of the settings counted by the kernel, "
            f"{made} made by the harness")


def fabric_changed(trusted: list[str], console: str = "") -> str:
    """How the fabric's settings the harness read after a run differ from
    those of its begin line, read before any driver was loaded ('' if they
    do not): each setting that decides ordering, and the seed, which must be
    the one the harness set last. The kernel keeps the settings read-only
    after boot, so an honest driver never changes them; one that did (by a
    call no allow-list grants, or by editing page tables) is flagged, and so
    is one whose store to them faulted (the console's oops says so). The
    card's counters, on which the verdict rests, are read-only as well: a
    store to them is flagged the same way."""
    if MODEL_STORE in console:
        return "a store to them faulted (the console log's oops)"
    if COUNTERS_STORE in console:
        return "a store to the ring card's counters faulted (the console log's oops)"
    before = _settings(harness_info(trusted))
    for line in trusted:
        at = line.find(FABRIC_LINE)
        if at < 0:
            continue
        now = _settings(line[at + len(FABRIC_LINE):])
        changed = [f"{k} {before[k]} -> {now.get(k, '(unreadable)')}"
                   for k in FABRIC_SETTINGS if k in before and now.get(k) != before[k]]
        if now.get("set_seed") and now.get("seed") != now["set_seed"]:
            changed.append(f"seed {now['set_seed']} -> {now.get('seed', '(unreadable)')}")
        other = _changes_by_others(before, now)
        if other:
            changed.append(other)
        if changed:
            return ", ".join(changed)
    return ""


def race_picture(channel: str, out_dir: str, title: str, kernel_src: str) -> Picture | None:
    """The timeline of the first failing run the harness sent (vm/record,
    RECORD_SEND=fail): race.svg and race.html in out_dir, and what it shows.
    The trace comes from the guest, like the student's module: it draws a
    picture and never decides a verdict. kernel_src: the lab kernel's source
    tree, whose mmiosim_ring.h names the card's registers."""
    recs = [r for r in timeline.recordings_in(channel) if r.text]
    if not recs:
        return None
    card = timeline.ring(kernel_src)
    try:
        d = timeline.draw(recs[0].text, title=title, ring=card)
    except timeline.TraceError:         # a malformed event: no picture, and no verdict
        return None
    if not d.svg:
        return None
    model.atomic_write(os.path.join(out_dir, "race.svg"), d.svg)
    model.atomic_write(os.path.join(out_dir, "race.html"), timeline.html_page(d, title))
    shows = d.finding.text if d.finding else d.summary
    excerpt = "\n".join(d.excerpt.splitlines()[:40])
    # The picture's first screen in words (for a terminal, a screen reader).
    words = "".join(f"  {s}\n" for s in d.words)
    return Picture(f"The first failing run, as traced: {shows}\n"
                   + (f"What race.html draws first:\n{words}" if words else "") + excerpt,
                   f"<p>{html.escape(shows)}</p>{d.focus_svg or d.svg}")


def without_heartbeats(channel: str, nonce: str) -> str:
    """The channel without the harness's progress heartbeats (vm/harness-lib.sh),
    which tell the host that the run moves and nothing else. A beat is one
    write from another process than the one writing the KTAP or a trace, so
    it may land inside a line of a trace being sent: removed whole, wherever
    it is, it leaves what the others wrote as they wrote it."""
    beat = re.compile(re.escape(f"{nonce} {PROGRESS_LINE} ") + r"[0-9]{0,20}\r?\n")
    return beat.sub("", channel)


def read(channel: str, console: str, nonce: str, picture_dir: str = "",
         title: str = "", kernel_src: str = "") -> GuestOutput:
    """Parse one run's output in this process (see read_bounded); with
    picture_dir, the race picture too (race_picture: title, kernel_src)."""
    channel = without_heartbeats(channel, nonce)
    parsed = ktap.parse(channel, nonce=nonce)
    trusted, _, _ = ktap.trusted_lines(channel, nonce)
    events = ktap.scan_console(console)
    out = GuestOutput(parsed, events, ktap.console_excerpt(console, events),
                      harness_info(trusted), fabric_changed=fabric_changed(trusted, console))
    if picture_dir:
        out.picture = race_picture(channel, picture_dir, title, kernel_src)
    return out


def _child(req: dict[str, Any]) -> dict[str, Any]:
    g = read(req["channel"], req["console"], req["nonce"], req["picture_dir"], req["title"],
             req["kernel_src"])
    return {"parsed": g.parsed.to_dict(), "events": [[e.kind, e.line_no, e.text] for e in g.events],
            "excerpt": g.excerpt, "info": g.info, "fabric_changed": g.fabric_changed,
            "picture": [g.picture.text, g.picture.html] if g.picture else None}


def unread(problem: str) -> GuestOutput:
    """A run whose output could not be read: every test it should have reported
    never reported (CRASHED), and the console is not clean."""
    parsed = ktap.ParseResult(root=ktap.Test(name="main", errors=[problem]))
    parsed.errors.append(problem)
    return GuestOutput(parsed, problem=problem)


def read_bounded(channel: str, console: str, nonce: str, picture_dir: str = "",
                 title: str = "", kernel_src: str = "", timeout: float = READ_TIMEOUT,
                 memory: int = READ_MEMORY) -> GuestOutput:
    """read() in a child with `timeout` seconds and `memory` bytes. If the child
    is stopped, the output is unread(): a graded failure that says why."""
    req = {"channel": channel, "console": console, "nonce": nonce,
           "picture_dir": picture_dir, "title": title, "kernel_src": kernel_src}
    try:
        d = bounded.call("guestout:_child", req, timeout, memory)
        pic = d["picture"]
        return GuestOutput(ktap.ParseResult.from_dict(d["parsed"]),
                           [ktap.ConsoleEvent(*e) for e in d["events"]], d["excerpt"],
                           d["info"], Picture(*pic) if pic else None,
                           fabric_changed=d["fabric_changed"])
    except (bounded.Stopped, KeyError, TypeError, ValueError) as e:
        why = str(e) if isinstance(e, bounded.Stopped) else f"reading it failed ({e!r})"
        return unread(f"the guest's output was not read: {why}; the grader reads a run's "
                      f"output with at most {timeout:.0f}s and {memory >> 20} MiB")
