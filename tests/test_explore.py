"""The student's own driver in the lab VM, and their own race on screen.

The library half (timeline.draw: what a trace shows; explore: the channel's
framing, the fabric words, the lab pages' commands) is tested on recorded
and made-up traces. The rest boots the lab VM as a student does: make -C
labs/LAB vm on a terminal (a pty), the lab page's "Explore first" commands
typed at its prompt, then the page's make -C labs/LAB timeline on the host;
the starter's recording must show a stale doorbell (posting: a late
interrupt), the reference fix's none.
"""

import base64
import gzip
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import unittest

from mmiolab import ROOT, explore, handout, kernel, timeline
from mmiolab.config import Config
from mmiolab.labspec import lab_names, load_lab
from kitcfg import BUILD, CFG, TREE, ring
from vmtest import log_dir, need_guest, report

FIGURES = os.path.join(ROOT, "Documentation", "figures")
PROMPT = re.compile(rb"mmiolab:/job# ")
HOST_CMD = re.compile(r"^\s*\$ (make -C labs/(\w+) (vm|timeline)\b.*)$", re.M)
# Tries of a recorded race on a busy host: the race needs both vCPUs running
# at once (labstats: the starter fails 100 runs in 100 on a quiet machine).
RACE_TRIES = 5


def page(lab: str) -> str:
    with open(os.path.join(ROOT, "labs", lab, "README.rst"), encoding="utf-8") as f:
        return f.read()


def host_commands(lab: str) -> list[str]:
    return [m.group(1) for m in HOST_CMD.finditer(page(lab)) if m.group(2) == lab]


def made_up_trace(irq_after_return: bool) -> str:
    """A posting-lab run: a doorbell and the INT_ENABLE=0 write posted by
    posttest, its ioctl() returning, both writes arriving 1.6 ms later, and
    the card's interrupt handled after that return or before the disable."""
    irq = "          <idle>-0       [001] d.H..     {}: irq_handler_entry: irq=24 name=postdrv"
    lines = [
        "# fabric: profile=sn2 locking=2004 route_ns=1500 jitter_ns=100000 bridge_ns=20000",
        "# trace_clock: mono",
        "# card_irq: 24",
        "        posttest-74      [000] d....     1.829125: mmiosim_post: win=0 cpu=0 seq=20 off=0x1c val=0xf t=1829152832",
        "        posttest-74      [000] d....     1.829129: mmiosim_post: win=0 cpu=0 seq=21 off=0x24 val=0x0 t=1829184768",
        "        posttest-74      [000] .....     1.829135: sys_exit: NR 16 = 0",
        "          <idle>-0       [000] d.h..     1.830763: mmiosim_drain: cpu=0 seq=20 t=1829152832",
        "          <idle>-0       [000] d.h..     1.830765: mmiosim_drain: cpu=0 seq=21 t=1829184768",
        "          <idle>-0       [000] d.h..     1.830766: mmiosim_arrive: win=0 cpu=0 seq=20 off=0x1c val=0xf t=1830765485",
        "          <idle>-0       [000] d.h..     1.830790: mmiosim_arrive: win=0 cpu=0 seq=21 off=0x24 val=0x0 t=1830789621",
    ]
    if irq_after_return:
        lines.append(irq.format("1.830844"))
    else:
        lines.insert(4, irq.format("1.829127"))
    return "\n".join(lines) + "\n"


class TimelineTest(unittest.TestCase):
    """What timeline.draw() finds in a trace: exact, from the trace alone."""

    def test_recorded_race_shows_its_stale_doorbell(self):
        with open(os.path.join(FIGURES, "race-trace.txt"), encoding="utf-8") as f:
            d = timeline.draw(f.read(), title="race", ring=ring())
        self.assertEqual(d.finding.kind, "stale-doorbell")
        self.assertTrue(d.finding.failure)
        self.assertIn("the card saw 21 and then 20", d.finding.text)
        # The finding's writes are marked (and labelled as the sentence says).
        self.assertIn('class="mmiosim-write doorbell overtaken stale marked"', d.svg)
        self.assertIn(">doorbell 20 (seq=838)</text>", d.svg)
        self.assertIn(">overtook seq=838</text>", d.svg)
        self.assertIn("1 stale doorbells", d.summary)

    def test_a_lost_drain_line_is_said_not_a_crash(self):
        """A recording whose trace buffer lost the overtaken write's drain line:
        the stale doorbell is still found and said, the lead in time is not
        (it raised TypeError, which the bounded reader turned into a crash)."""
        path = os.path.join(os.path.dirname(__file__), "data", "traces",
                            "doorbell-starter.txt.gz")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = "".join(line for line in f
                           if not ("mmiosim_drain:" in line and " seq=723 " in line))
        d = timeline.draw(text, title="lost drain", ring=ring())
        self.assertEqual(d.finding.kind, "stale-doorbell")
        self.assertIn("the trace lost one of the two drain times", d.finding.text)

    def test_long_excerpt_is_thinned_not_dropped(self):
        """A long-stalled doorbell spans hundreds of other writes: the excerpt
        keeps it and its neighbour whole, and whole writes nearest it."""
        # Recorded in the doorbell lab VM (record ringtest -n 10000, the starter):
        # its stale doorbell was held 6.5 ms in a stall, past 420 other events.
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "traces",
                            "stalled-doorbell.txt.gz")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = f.read()
        d = timeline.draw(text, ring=ring())
        self.assertIsNotNone(d.finding, d.warnings)
        self.assertIn("a stale doorbell", d.finding.text)
        self.assertIn("left out", d.excerpt)
        self.assertRegex(d.svg, r'class="mmiosim-write[^"]* stale[ "]')
        tr = timeline.parse(text, ring=ring())
        stale = next(w for w in tr.writes.values() if w.stale)
        later = min((w for w in tr.writes.values() if w.off == stale.off and w.seq > stale.seq),
                    key=lambda w: w.seq)
        full = timeline.excerpt_lines(tr, [stale, later], 0)
        must = len(stale.lines + later.lines)
        self.assertGreater(len(full), must + 4)
        cut = must + (len(full) - must) // 2
        lines = timeline.excerpt_lines(tr, [stale, later], 0, max_lines=cut)
        self.assertLessEqual(len(lines), cut)
        self.assertLess(must, len(lines))
        self.assertTrue(set(stale.lines + later.lines) <= set(lines))
        kept = set(lines)
        for w in tr.writes.values():
            self.assertIn(len(kept & set(w.lines)), (0, len(w.lines)), w)

    def test_recorded_fixes_show_no_failure(self):
        for name, kind in (("fix-mmiowb", "mmiowb"), ("fix-readback", "read")):
            with open(os.path.join(FIGURES, f"{name}-trace.txt"), encoding="utf-8") as f:
                d = timeline.draw(f.read(), title=name, ring=ring())
            self.assertEqual(d.finding.kind, kind, name)
            self.assertFalse(d.finding.failure, name)
            self.assertNotRegex(d.svg, r'class="mmiosim-write[^"]* stale[ "]', name)

    def test_late_interrupt_is_one_after_the_disabling_call_returned(self):
        d = timeline.draw(made_up_trace(irq_after_return=True), ring=ring())
        self.assertEqual(d.finding.kind, "late-interrupt")
        self.assertIn("its ioctl() returned 6.0 \u00b5s later", d.finding.text)
        self.assertIn("1 interrupts of the card (1 late)", d.summary)
        self.assertIn("interrupts off (too late)", d.svg)
        self.assertIn('class="mmiosim-irq late"', d.svg)
        # No late interrupt, but STOP returned 1.6 ms before its disable arrived:
        # what the posting lab's test fails.
        d = timeline.draw(made_up_trace(irq_after_return=False), ring=ring())
        self.assertEqual(d.finding.kind, "early-return")
        self.assertTrue(d.finding.failure)
        self.assertIn("1654.6 \u00b5s before the write reached the card", d.finding.text)
        self.assertIn("(0 late)", d.summary)
        self.assertIn("interrupts off (too late)", d.svg)
        # The same call returning after the disable arrived (a read-back): no failure.
        text = made_up_trace(irq_after_return=False).replace(
            "1.829135: sys_exit: NR 16 = 0\n", "")
        text += "        posttest-74      [000] .....     1.830800: sys_exit: NR 16 = 0\n"
        d = timeline.draw(text, ring=ring())
        self.assertEqual(d.finding.kind, "disable")
        self.assertFalse(d.finding.failure)
        self.assertNotIn("too late", d.svg)

    def test_late_interrupt_needs_the_card_irq(self):
        text = made_up_trace(True).replace("# card_irq: 24\n", "# card_irq: 25\n")
        self.assertEqual(timeline.draw(text, ring=ring()).finding.kind, "early-return")

    def test_overwritten_events_are_said(self):
        text = "# entries-in-buffer/entries-written: 11/40   #P:2\n" + made_up_trace(True)
        d = timeline.draw(text, ring=ring())
        self.assertTrue(any("29 oldest events were overwritten" in w for w in d.warnings),
                        d.warnings)

    def test_nothing_to_draw_is_said_not_drawn(self):
        d = timeline.draw("# tracer: nop\n", ring=ring())
        self.assertIsNone(d.finding)
        self.assertEqual(d.svg, "")


SKIP_FABRIC = ("# fabric: profile=sn2 locking=2004 route_ns=1500,9000 jitter_ns=0 "
               "bridge_ns=2000 read_ns=10000 stall_ns=0 stall_ppm=0 seed=1 clock={} changes=0")
DOORBELL, INT_ENABLE, CONSUMER = 0x1c, 0x24, 0x20


def line(us: int, event: str, tcpu: int, task: str = "ringtest-74", **fields: int) -> str:
    """A trace line recorded at us (the line's timestamp, µs) on CPU tcpu, as
    /sys/kernel/tracing/trace prints it; off= and val= in hex."""
    args = " ".join(f"{k}={v:#x}" if k in ("off", "val") else f"{k}={v}"
                    for k, v in fields.items())
    return (f"{task:>16}      [{tcpu:03d}] d....  {us // 10**6:5d}.{us % 10**6:06d}: "
            f"{event}: {args}")


def skip_race(skip: bool = True) -> tuple[str, int]:
    """A doorbell race: CPU 1 posts doorbell 20 (route 9 us), CPU 0 doorbell
    21 (1.5 us), then reads CONSUMER, which pushes 21 to the card at once and
    costs 10 us; 20 arrives after it, stale, and the card's interrupt is
    handled on CPU 1. Under mmiosim.clock=skip (skip) the fabric's clock is
    1 ms ahead of the lines' timestamps at first, and the read, instead of
    spinning, skips ahead: the lead grows to 1.0095 ms. Under clock=real the
    read spins (the lines after it are 10 us later) and a fabric time can be
    a little past its line's timestamp (rounded to the microsecond), with no
    lead. Returns (trace, the lead after the read)."""
    lead = 1_000_000 if skip else 0
    after = lead + 9_500 if skip else 0
    spun = 0 if skip else 10                 # us the read spins in the guest
    arrive11 = (2003, 2_004_500 + lead) if skip else (2005, 2_004_300)
    lines = [SKIP_FABRIC.format("skip" if skip else "real"), "# trace_clock: mono",
             "# card_irq: 24",
             line(2000, "mmiosim_post", 1, win=0, cpu=1, seq=10, off=DOORBELL, val=20,
                  t=2_009_000 + lead, posted=2_000_000 + lead),
             line(2002, "mmiosim_post", 0, win=0, cpu=0, seq=11, off=DOORBELL, val=21,
                  t=2_003_500 + lead, posted=2_002_000 + lead),
             line(2003, "mmiosim_drain", 0, cpu=0, seq=11, t=2_002_500 + lead),
             line(arrive11[0], "mmiosim_arrive", 0, win=0, cpu=0, seq=11, off=DOORBELL, val=21,
                  t=arrive11[1], posted=2_002_000 + lead),
             line(2003 + spun, "mmiosim_read", 0, win=0, cpu=0, off=CONSUMER, val=0, cost=10_000,
                  t=2_002_500 + lead),
             line(2004 + spun, "mmiosim_drain", 1, cpu=1, seq=10, t=2_009_000 + lead)
             + " overtaken",
             line(2004 + spun, "mmiosim_arrive", 1, win=0, cpu=1, seq=10, off=DOORBELL, val=20,
                  t=2_004_000 + spun * 1000 + after - 200, posted=2_000_000 + lead),
             line(2006 + spun, "irq_handler_entry", 1, task="<idle>-0", irq=24).replace(
                 "irq=24", "irq=24 name=ringdev")]
    return "\n".join(lines) + "\n", after


def skip_posting(readback: bool) -> str:
    """The posting lab under mmiosim.clock=skip: posttest on CPU 0 posts a
    doorbell and INT_ENABLE=0 with the lead at 2 ms; then either its ioctl()
    returns and CPU 1 skips 1.7 ms ahead in an mmiowb() (the lead is then
    3.7 ms), the writes arrive and the card's interrupt is handled on CPU 1
    (a late interrupt); or (readback) it reads CONSUMER, which delivers both
    writes and skips 45 us ahead, before its ioctl() returns (no failure)."""
    lead = 2_000_000
    out = ["# fabric: profile=sn2 locking=2004 route_ns=1500 jitter_ns=100000 bridge_ns=20000 "
           "clock=skip changes=0", "# trace_clock: mono", "# card_irq: 24",
           line(1_829_125, "mmiosim_post", 0, "posttest-74", win=0, cpu=0, seq=20, off=DOORBELL,
                val=15, t=1_829_152_832 + lead, posted=1_829_125_000 + lead),
           line(1_829_129, "mmiosim_post", 0, "posttest-74", win=0, cpu=0, seq=21,
                off=INT_ENABLE, val=0, t=1_829_184_768 + lead, posted=1_829_129_000 + lead)]
    if readback:
        now = 1_829_130_000 + lead
        out += [line(1_829_130, "mmiosim_drain", 0, "posttest-74", cpu=0, seq=20, t=now),
                line(1_829_130, "mmiosim_drain", 0, "posttest-74", cpu=0, seq=21, t=now),
                line(1_829_130, "mmiosim_arrive", 0, "posttest-74", win=0, cpu=0, seq=20,
                     off=DOORBELL, val=15, t=now + 20_000, posted=1_829_125_000 + lead),
                line(1_829_130, "mmiosim_arrive", 0, "posttest-74", win=0, cpu=0, seq=21,
                     off=INT_ENABLE, val=0, t=now + 40_000, posted=1_829_129_000 + lead),
                line(1_829_131, "mmiosim_read", 0, "posttest-74", win=0, cpu=0, off=CONSUMER,
                     val=0, cost=45_000, t=now),
                line(1_829_133, "sys_exit", 0, "posttest-74")+ "NR 16 = 0"]
    else:
        skipped = lead + 1_700_000
        out += [line(1_829_135, "sys_exit", 0, "posttest-74")+ "NR 16 = 0",
                line(1_829_140, "mmiosim_mmiowb", 1, "ringtest-75", cpu=1, wait=1_700_000,
                     t=1_829_140_000 + lead),
                line(1_829_141, "mmiosim_drain", 1, "<idle>-0", cpu=0, seq=20,
                     t=1_829_152_832 + lead),
                line(1_829_141, "mmiosim_drain", 1, "<idle>-0", cpu=0, seq=21,
                     t=1_829_184_768 + lead),
                line(1_829_141, "mmiosim_arrive", 1, "<idle>-0", win=0, cpu=0, seq=20,
                     off=DOORBELL, val=15, t=1_830_765_485 + lead, posted=1_829_125_000 + lead),
                line(1_829_141, "mmiosim_arrive", 1, "<idle>-0", win=0, cpu=0, seq=21,
                     off=INT_ENABLE, val=0, t=1_830_789_621 + lead,
                     posted=1_829_129_000 + lead),
                line(1_829_142, "irq_handler_entry", 1, "<idle>-0", irq=24).replace(
                    "irq=24", "irq=24 name=postdrv")]
        assert 1_829_141_000 + skipped >= 1_830_789_621 + lead     # arrived by then
    return "\n".join(out) + "\n"


class SkipClockTimelineTest(unittest.TestCase):
    """Under mmiosim.clock=skip the fabric's times (t=, posted=) run ahead of
    the lines' timestamps by a lead that grows during a run: the writes and
    waits are drawn on the fabric's clock, the kernel's own events moved
    onto it by the lead seen so far."""

    def test_a_stale_doorbell_and_its_read_on_the_fabrics_clock(self):
        text, lead = skip_race()
        tr = timeline.parse(text, ring=ring())
        self.assertEqual((tr.writes[10].post, tr.writes[11].post), (3_000_000, 3_002_000))
        self.assertEqual(lead, 1_009_500)
        read = tr.spans[0]
        self.assertEqual((read.kind, read.start, read.end), ("read", 3_002_500, 3_012_500))
        # The interrupt: its line's timestamp plus the lead the read showed.
        self.assertEqual(tr.irqs[0].ts, 2_006_000 + lead)
        d = timeline.draw(text, ring=ring())
        self.assertEqual(d.finding.kind, "stale-doorbell")
        self.assertEqual(set(d.finding.marked), {10, 11})
        self.assertIn("entered the bridge 6.50 \u00b5s earlier", d.finding.text)
        self.assertIn("the card saw 21 and then 20", d.finding.text)
        # The picture starts at the first post, on the fabric's clock (the
        # line's timestamps would put the read 1 ms before every write).
        self.assertIn("t0 = 3000000 ns", d.svg)
        self.assertIn("readl(CONSUMER) took 10000 ns", d.svg)
        self.assertNotIn("or a little earlier", d.svg)
        self.assertEqual([s.split(":")[0] for s in d.words],
                         ["[the finding] seq 10", "[the finding] seq 11"])
        self.assertIn("posted at +2.00 \u00b5s", d.words[1])

    def test_an_excerpt_keeps_the_lead_shown_before_it(self):
        text, _ = skip_race()
        # Events before the excerpt that showed a larger lead than its own lines do.
        extra = [line(1500, "mmiosim_post", 0, win=0, cpu=0, seq=8, off=CONSUMER, val=0,
                      t=1_501_500 + 1_050_000, posted=1_500_000 + 1_050_000),
                 line(1502, "mmiosim_drain", 0, cpu=0, seq=8, t=2_551_500),
                 line(1503, "mmiosim_arrive", 0, win=0, cpu=0, seq=8, off=CONSUMER, val=0,
                      t=2_553_000, posted=2_550_000)]
        head, rest = text.split("# card_irq: 24\n")
        text = head + "# card_irq: 24\n" + "\n".join(extra) + "\n" + rest
        # An interrupt inside the excerpt, before any line of it shows that lead.
        post11 = next(ln for ln in text.splitlines() if "seq=11" in ln)
        text = text.replace(post11 + "\n", post11 + "\n" + line(
            2002, "irq_handler_entry", 1, task="<idle>-0", irq=25) + "\n")
        tr = timeline.parse(text, ring=ring())
        self.assertEqual([q.ts for q in tr.irqs], [2_002_000 + 1_050_000, 2_006_000 + 1_050_000])
        d = timeline.draw(text, ring=ring())
        self.assertEqual(d.finding.kind, "stale-doorbell")
        self.assertIn("# fabric_lead_ns: 1050000\n", d.excerpt)
        cut = timeline.parse(d.excerpt, ring=ring())
        self.assertNotIn(8, cut.writes)
        self.assertEqual(cut.irqs[0].ts, tr.irqs[0].ts)
        # The header is the guest's, like the rest: one that is no number is none.
        bad = timeline.parse(d.excerpt.replace("lead_ns: 1050000", "lead_ns: -5x"), ring=ring())
        self.assertEqual(bad.irqs[0].ts, 2_002_000 + 1_000_000)

    def test_a_late_interrupt_after_the_lead_grew(self):
        d = timeline.draw(skip_posting(readback=False), ring=ring())
        self.assertEqual(d.finding.kind, "late-interrupt")
        self.assertIn("its ioctl() returned 6.0 \u00b5s later", d.finding.text)
        self.assertIn("reached the card 1660.6 \u00b5s after it was posted", d.finding.text)
        # Placed by the lead CPU 1's mmiowb() showed: after the arrival, as
        # the card raises its interrupt only while it is enabled.
        self.assertIn("was handled on CPU 1 1707.0 \u00b5s after that return, 52.4 \u00b5s "
                      "after it arrived", d.finding.text)
        self.assertIn('class="mmiosim-irq late"', d.svg)
        words = [s for s in d.words if "interrupt" in s or "returns" in s]
        self.assertEqual(len(words), 2, d.words)
        self.assertIn("returns on CPU 0 at +10.00 \u00b5s", words[0])
        self.assertIn("handled on CPU 1 at +1717.00 \u00b5s", words[1])

    def test_a_read_back_before_the_return_is_no_early_return(self):
        """The read delivered the disable and skipped ahead: the call's
        return, placed by that lead, comes after the arrival (on the lines'
        timestamps alone it came 37 us before it)."""
        d = timeline.draw(skip_posting(readback=True), ring=ring())
        self.assertEqual(d.finding.kind, "disable", d.finding.text)
        self.assertFalse(d.finding.failure)
        self.assertIn("it reached the card 41.0 \u00b5s later", d.finding.text)
        self.assertIn("returned 48.0 \u00b5s after the write was posted", d.finding.text)
        self.assertNotIn("too late", d.svg)

    def test_under_the_real_clock_nothing_moves(self):
        """mmiosim.clock=real with the new fields: a fabric time up to 499 ns
        past its line's timestamp is the timestamp's rounding, not a lead;
        posted= is the post time, with no "a little earlier" about it."""
        text, lead = skip_race(skip=False)
        self.assertEqual(lead, 0)
        tr = timeline.parse(text, ring=ring())
        self.assertEqual(tr.irqs[0].ts, 2_016_000)
        self.assertEqual(tr.spans[0].end, 2_012_500)
        # CPU 1's post line recorded 3 us after the post (the fabric
        # delivered earlier writes first): posted= says when it was.
        text = text.replace(" 0.002000: mmiosim_post", " 0.002003: mmiosim_post")
        self.assertEqual(timeline.parse(text, ring=ring()).writes[10].post, 2_000_000)
        d = timeline.draw(text, ring=ring())
        self.assertEqual(d.finding.kind, "stale-doorbell")
        self.assertNotIn("or a little earlier", d.svg)
        self.assertNotIn("fabric_lead_ns", d.excerpt)
        # An older kernel's post (no posted=) is placed by its line, and said so.
        old = re.sub(r" posted=\d+", "", text)
        self.assertIn("or a little earlier", timeline.draw(old, ring=ring()).svg)


def frame(n: int, text: str, cut: int = 0, end: bool = True) -> str:
    body = base64.encodebytes(gzip.compress(text.encode())).decode()
    if cut:
        body = body[:cut] + "\n"
    return (f"=== mmiolab record {n} begin ===\r\r\n" + body.replace("\n", "\r\r\n")
            + (f"=== mmiolab record {n} end ===\r\r\n" if end else ""))


class RingHeaderTest(unittest.TestCase):
    """The card's register names come from include/linux/mmiosim_ring.h of the
    lab kernel tree, the one place they are written."""

    def tearDown(self):
        timeline.ring.cache_clear()

    def test_the_header_gives_the_registers(self):
        from mmiolab import kernel
        header = os.path.join(TREE.src, timeline.RING_HEADER)
        if not os.path.exists(header):
            self.skipTest(f"{header} missing: no lab kernel tree")
        with open(header, encoding="utf-8") as f:
            ring = timeline.parse_ring_header(f.read())
        self.assertEqual((ring.doorbell, ring.int_enable), (0x1c, 0x24))
        self.assertEqual(ring.name(0x20), "CONSUMER")
        self.assertEqual(ring.name(0x44), "0x44")
        # the flags, the ID value, the ring size and the window are no registers
        self.assertEqual(sorted(ring.regs), list(range(0, 0x34, 4)))

    def test_a_header_without_the_registers_is_said(self):
        text = ("#define MMIOSIM_RING_WINDOW\t\t0x40\n"
                "#define MMIOSIM_RING_DOORBELL\t\t0x1c\t/* wo */\n"
                "#define MMIOSIM_RING_CTRL_ENABLE\t0x4\n")
        with self.assertRaises(timeline.TraceError) as e:
            timeline.parse_ring_header(text, "x.h")
        self.assertIn("x.h is not the ring card's register map (no MMIOSIM_RING_INT_ENABLE)",
                      str(e.exception))
        ring = timeline.parse_ring_header(text + "#define MMIOSIM_RING_INT_ENABLE 0x24\n")
        self.assertEqual(ring.regs, {0x1c: "DOORBELL", 0x24: "INT_ENABLE"})

    def test_without_a_kernel_tree_a_clear_error(self):
        with tempfile.TemporaryDirectory() as empty:
            # The kernel tree of a build folder with none.
            with self.assertRaises(timeline.TraceError) as e:
                timeline.ring(kernel.tree(Config(build=empty)).src)
        self.assertIn("run 'make kernel'", str(e.exception))
        self.assertIn(timeline.RING_HEADER, str(e.exception))


class ExploreHostTest(unittest.TestCase):
    def test_recordings_come_back_whole_or_are_said_incomplete(self):
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            channel = os.path.join(tmp, "channel.log")
            with open(channel, "w") as f:
                f.write(frame(1, "trace one\n") + frame(2, "trace two\n" * 500, cut=40)
                        + frame(3, "trace three\n", end=False))
            recs = explore.recordings(channel)
            self.assertEqual([r.number for r in recs], [1, 2, 3])
            self.assertEqual(recs[0].text, "trace one\n")
            self.assertIn("damaged", recs[1].problem)
            self.assertIn("stopped while it was being sent", recs[2].problem)
            self.assertEqual(explore.save_recordings(tmp), [os.path.join(tmp, "record-1.txt")])
            with self.assertRaises(explore.ExploreError) as e:
                explore.find_recording(None, 0, channel, cfg=CFG)
            self.assertIn("recording 3", str(e.exception))
            text, path = explore.find_recording(None, 1, channel, cfg=CFG)
            self.assertEqual((text, os.path.basename(path)), ("trace one\n", "record-1.txt"))

    def test_fabric_words_start_from_the_lab_and_take_the_students(self):
        spec = load_lab("posting")
        words = explore.fabric_words(spec, "profile=pc mmiosim.seed=3 locking=5.2")
        self.assertIn("mmiosim.profile=pc", words)
        self.assertIn("mmiosim.locking=5.2", words)
        self.assertIn("mmiosim.seed=3", words)
        self.assertIn(f"mmiosim.stall_ppm={spec.fabric['stall_ppm']}", words)
        self.assertEqual(len([w for w in words if w.startswith("mmiosim.profile=")]), 1)
        for bad in ("profile", "profile=pc;reboot", "Profile=pc", "x='1'"):
            with self.assertRaises(explore.ExploreError, msg=bad):
                explore.fabric_words(spec, bad)
        with self.assertRaises(explore.ExploreError) as e:      # the kit's old word
            explore.fabric_words(spec, "semantics=5.2")
        self.assertIn("FABRIC='locking=5.2'", str(e.exception))

    def test_every_lab_page_explores_with_these_commands(self):
        for lab in lab_names():
            spec = load_lab(lab)
            cmds = explore.page_commands(spec)
            self.assertIn(f"insmod {spec.module}.ko", cmds, lab)
            self.assertTrue(any(c.startswith("record ") for c in cmds), lab)
            self.assertEqual(cmds[-1], "exit", lab)
            self.assertEqual(host_commands(lab), [f"make -C labs/{lab} vm",
                                                  f"make -C labs/{lab} timeline"], lab)
            built = explore.Built("/x.ko", f"starter/{spec.files[0]}", [])
            shown = explore.banner(spec, built, ["t"], 2)
            for c in cmds:
                self.assertIn(f"\n  {c}\n", shown, lab)

    def test_the_handout_carries_it(self):
        files = handout.kit_files()
        for lab in lab_names():
            got = handout.members(load_lab(lab), files)
            for need in ("vm/record", "scripts/kit", "scripts/mmiolab/explore.py",
                         "scripts/mmiolab/timeline.py", "labs/lab.mk"):
                self.assertIn(need, got, lab)
            self.assertNotIn("scripts/trace-timeline", got, lab)


class Console:
    """A command on a terminal of its own, driven like a student would."""

    def __init__(self, argv: list[str], cwd: str, env: dict, log: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:      # the child: the student's shell, in effect
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        self.buf = b""
        self.log = open(log, "wb")

    def expect(self, rx: re.Pattern, timeout: float) -> str:
        """Read until rx matches; the text up to and including the match."""
        end = time.monotonic() + timeout
        while True:
            m = rx.search(self.buf)
            if m:
                out, self.buf = self.buf[:m.end()], self.buf[m.end():]
                return out.decode(errors="replace").replace("\x1b[6n", "")
            left = end - time.monotonic()
            ready = select.select([self.fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                raise AssertionError(f"no {rx.pattern!r} in {timeout:.0f}s; the terminal shows:\n"
                                     + self.buf[-3000:].decode(errors="replace"))
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                raise AssertionError(f"the terminal closed before {rx.pattern!r}:\n"
                                     + self.buf[-3000:].decode(errors="replace"))
            self.log.write(chunk)
            self.log.flush()
            self.buf += chunk

    def type(self, line: str, timeout: float = 300) -> str:
        """Type a command at the guest's prompt; its output, up to the next prompt."""
        os.write(self.fd, line.encode() + b"\r")
        return self.expect(PROMPT, timeout)

    def finish(self, line: str, timeout: float = 120) -> int:
        """Type the last command; the exit status of the whole command."""
        os.write(self.fd, line.encode() + b"\r")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if select.select([self.fd], [], [], 1)[0]:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    chunk = b""
                self.log.write(chunk)
                self.buf += chunk
                if not chunk:
                    break
        return self.close()

    def close(self, grace: float = 15) -> int:
        """Wait for the command to end (at most grace seconds), else kill its
        process group (pty.fork made it a session leader); its exit status."""
        try:
            end = time.monotonic() + grace
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            while pid == 0 and time.monotonic() < end:
                time.sleep(0.2)
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                os.killpg(self.pid, signal.SIGKILL)
                _, status = os.waitpid(self.pid, 0)
        finally:
            os.close(self.fd)
            self.log.close()
        return os.waitstatus_to_exitcode(status)


def student_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["MMIOLAB_BUILD"] = BUILD
    return env


class ExploreVMTest(unittest.TestCase):
    """The lab page's commands, typed into the lab VM, then drawn on the host."""

    def setUp(self):
        need_guest(self)

    def explore(self, lab: str, submission: str = "", kit: str = ROOT, fabric: str = "",
                again=None):
        """make -C labs/LAB vm [SUBMISSION=...]; the page's guest commands; the
        page's timeline command. Returns (the session's terminal text, the
        timeline command's output). again(output): whether to reload the
        driver and repeat a record command (at most RACE_TRIES runs)."""
        cmd, timeline_cmd = host_commands(lab)
        argv = cmd.split() + ([f"SUBMISSION={submission}"] if submission else []) \
            + ([f"FABRIC={fabric}"] if fabric else [])
        name = f"explore-{lab}-{os.path.basename(os.path.dirname(submission)) or 'starter'}"
        con = Console(argv, kit, student_env(), os.path.join(log_dir(name), "terminal.log"))
        t0 = time.monotonic()
        try:
            shown = con.expect(PROMPT, 600)
            report(f"{lab}: {' '.join(argv[1:])}: the guest prompt after "
                   f"{time.monotonic() - t0:.1f}s")
            self.assertIn("Try (the commands of the lab page's", shown)
            spec = load_lab(lab)
            cmds = explore.page_commands(spec)
            for c in cmds:
                self.assertIn(f"\n  {c}", shown.replace("\r", ""))
            text = shown
            for c in cmds[:-1]:
                out = con.type(c)
                text += out
                tries = 1
                while c.startswith("record ") and again and again(out) and tries < RACE_TRIES:
                    report(f"{lab}: {c}: {again(out)} (load average "
                           f"{os.getloadavg()[0]:.1f}): again")
                    text += con.type(f"rmmod {spec.module}") + con.type(f"insmod {spec.module}.ko")
                    out = con.type(c)
                    text += out
                    tries += 1
                if c.startswith("record "):
                    self.assertRegex(out, r"record: recording \d+: \d+ trace lines")
                    self.assertIn(f"make -C labs/{lab} timeline", out)
            status = con.finish(cmds[-1])
        except BaseException:
            con.close(grace=0)
            raise
        self.assertEqual(status, 0, text[-2000:])
        res = subprocess.run(timeline_cmd.split(), cwd=kit, env=student_env(),
                             capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             timeout=300)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        return text, res.stdout

    def assert_picture(self, out: str, kit: str = ROOT) -> str:
        m = re.search(r"mmiolab: picture: (\S+\.html)", out)
        self.assertIsNotNone(m, out)
        html = os.path.join(kit, m.group(1))
        with open(html, encoding="utf-8") as f:
            page = f.read()
        # Each write's post, drain and arrival are in order in the whole
        # recording (a flush at its end once left a drain time after the
        # arrival, and the picture was dropped).
        with open(html.removesuffix(".html") + ".txt", encoding="utf-8") as f:
            tr = timeline.parse(f.read(), ring=ring())
        bad = [(w.seq, w.post, w.drain, w.arrive) for w in tr.writes.values()
               if w.complete and not w.post <= w.drain <= w.arrive]
        self.assertEqual(bad, [], "writes out of order (seq, post, drain, arrival in ns)")
        # The page's own warnings say why a picture is missing; the page is long.
        self.assertTrue('<svg xmlns="http://www.w3.org/2000/svg" class="mmiosim-timeline"' in page,
                        f"{html}: no picture; " + " ".join(re.findall(r"Warning: [^<]*", page)))
        return page

    def test_doorbell_starter_shows_its_stale_doorbell(self):
        def again(out):
            return "the card counted no stale doorbell" if "counted 0 stale" in out else ""
        text, out = self.explore("doorbell", again=again)
        self.assertRegex(text, r"the card counted [1-9]\d* stale doorbells")
        self.assertRegex(out, r"(?m)^Found: CPU \d wrote doorbell \d+ .*: a stale doorbell\.$")
        page = self.assert_picture(out)
        self.assertRegex(page, r'class="mmiosim-write[^"]* stale[ "]')
        report("doorbell starter: " + next(ln for ln in out.splitlines()
                                           if ln.startswith("Found:"))[:200])

    def test_doorbell_reference_fix_shows_none(self):
        fix = load_lab("doorbell").solution_source("mmiowb", CFG)
        text, out = self.explore("doorbell", fix)
        self.assertIn("built from " + fix, text.replace("\r", "").replace("\n", " "))
        self.assertRegex(text, r"the card counted 0 stale doorbells")
        self.assertIn("No stale doorbell or late interrupt", out)
        self.assertRegex(out, r"The whole run: \d+ writes \(\d+ doorbells\), 0 stale doorbells")
        self.assert_picture(out)

    def test_posting_starter_shows_a_late_interrupt(self):
        text, out = self.explore("posting")
        self.assertRegex(text, r"not ok 1 teardown")
        self.assertRegex(out, r"(?m)^Found: .* wrote 0 to INT_ENABLE .*: (a late interrupt|"
                         r"the card's interrupt was still on when the call returned)\.$")
        page = self.assert_picture(out)
        self.assertIn("interrupts off (too late)", page)

    def test_build_errors_are_the_compilers_with_the_students_file_name(self):
        starter = os.path.join(ROOT, "labs", "doorbell", "starter", "ringdrv.c")
        with open(starter) as f:
            src = f.read()
        doorbell = "writel(rd->tail, rd->regs + MMIOSIM_RING_DOORBELL);"
        self.assertIn(doorbell, src)
        cases = {
            "typo.c": (src.replace(doorbell, doorbell[:-1]),
                       [r"(?m)^typo\.c:\d+:\d+: error: expected ';'", r"(?m)^ +\| +\^"]),
            "undefined.c": (src.replace(doorbell, doorbell + "\n\tmmiolab_no_such(rd);")
                            .replace("static void ringdrv_post(",
                                     "void mmiolab_no_such(void *p);\nstatic void ringdrv_post("),
                            [r'ERROR: modpost: "mmiolab_no_such" \[ringdrv\.ko\] undefined!']),
        }
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            for name, (text, want) in cases.items():
                path = os.path.join(tmp, name)
                with open(path, "w") as f:
                    f.write(text)
                rel = os.path.relpath(path, os.path.join(ROOT, "labs", "doorbell"))
                res = subprocess.run(["make", "-s", "-C", "labs/doorbell", "vm",
                                      f"SUBMISSION={rel}"], cwd=ROOT, env=student_env(),
                                     capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                     timeout=600)
                out = res.stdout + res.stderr
                self.assertNotEqual(res.returncode, 0, out)
                self.assertIn(f"mmiolab: {name} does not compile:", out)
                for rx in want:
                    self.assertRegex(out, rx)
                for host in (ROOT, BUILD, tmp, "/build/"):
                    self.assertNotIn(host, out.replace(f"SUBMISSION={rel}", ""), name)
                self.assertNotIn("booting the lab VM", out, name)

    def test_unpacked_handout_explores_with_other_fabric_settings(self):
        """The student's kit, unpacked elsewhere: make -C labs/doorbell vm with
        FABRIC words boots with them (the banner's fabric line says so), and
        the banner says which one the fabric did not take."""
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            # As root the confined build runs as nobody, who must reach the
            # handout's prebuilt kernel (a student's own folder is theirs).
            os.chmod(tmp, 0o755)
            site = os.path.join(tmp, "site")
            os.makedirs(site)
            tarball = handout.pack(load_lab("doorbell"), site, tmp, cfg=CFG)
            with tarfile.open(tarball) as tar:
                tar.extractall(tmp)
            kit = os.path.join(tmp, "mmiolab-doorbell")
            argv = ["make", "-C", "labs/doorbell", "vm", "FABRIC=seed=5 jitter_ns=7000 bridge_ns=x1"]
            con = Console(argv, kit, student_env(),
                          os.path.join(log_dir("explore-handout"), "terminal.log"))
            try:
                shown = con.expect(PROMPT, 600).replace("\r", "")
                status = con.finish("exit")
            except BaseException:
                con.close()
                raise
            self.assertEqual(status, 0, shown[-2000:])
            fabric = re.search(r"(?m)^The fabric: (.*)$", shown)
            self.assertIsNotNone(fabric, shown[-2000:])
            self.assertIn("jitter_ns=7000", fabric.group(1))
            self.assertIn("seed=5", fabric.group(1))
            notes = re.findall(r"(?m)^Note: mmiosim\.(\w+)=\S+ was asked for", shown)
            self.assertEqual(notes, ["bridge_ns"], shown[-2000:])
            self.assertIn("built from starter/ringdrv.c", shown)
            shutil.rmtree(kit)


if __name__ == "__main__":
    unittest.main()
