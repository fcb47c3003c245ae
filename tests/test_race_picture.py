"""The student's race picture (issue 37), laid out by headless Chromium.

race.html (beside every failing report, and from `make -C labs/LAB timeline`)
and the docs' recorded figures are drawn by scripts/mmiolab/timeline.py. For
every real recording stored under tests/data/traces/ (guest runs of the labs'
starters and wrong fixes, as vm/record sent them) and for the docs' figures:

- at widths from a phone's (390 px) to a desktop's (1280 px), with the page
  as it opens and with every <details> opened, no two text labels of a
  picture overlap and none lies outside its picture, measured on the boxes
  Chromium lays out (tests/svgcheck.py), and the page itself never scrolls
  sideways (the whole excerpt scrolls in its own box);
- the first screen shows the failure: the writes the "Found:" sentence
  names are highlighted and labelled with its words, inside the first
  900 px (1280 px wide) or 844 px (a phone);
- runs of writes that wait together are folded into one labelled bar;
- the picture keeps its title and description, and the page says it in
  words.

Screenshots are left in build/test-race-picture/. Needs Debian's chromium
and the lab kernel's tree (for the card's register names); boots no guest.
"""

import glob
import gzip
import os
import re
import shutil
import unittest

from mmiolab import timeline
from kitcfg import BUILD, ring

import svgcheck

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRACES = os.path.join(HERE, "data", "traces")
FIGURES = os.path.join(ROOT, "Documentation", "figures")
OUT = os.path.join(BUILD, "test-race-picture")
WIDTHS = (390, 768, 1000, 1280)
# The first screen: (width, height) of a phone and a desktop.
SCREENS = ((390, 844), (1280, 900))


def recordings():
    """The stored recordings: name -> trace text."""
    out = {}
    for path in sorted(glob.glob(os.path.join(TRACES, "*.txt.gz"))):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            out[os.path.basename(path)[:-len(".txt.gz")]] = f.read()
    return out


def as_skip_clock(text, start_ns=1_000_000, step_ns=50_000):
    """A recording as a kernel with mmiosim.clock=skip would print the same
    run, and the lead at each of its lines: the lead starts at start_ns and
    grows by step_ns at each mmiowb() and read (where a CPU would have waited);
    the fabric's times (t=, and the new posted=) are the recorded ones plus
    the lead when they were taken (a drain time: at its post), the lines'
    timestamps are kept. Returns (text, {line number: lead}, {line number:
    the lead at the last wait up to it, 0 before the first})."""
    tr = timeline.parse(text, ring=ring())
    by_line = {ev.lineno: ev for ev in tr.events}
    at_post: dict[int, int] = {}            # seq -> the lead when it was posted
    leads: dict[int, int] = {}
    waited: dict[int, int] = {}
    last_wait = 0
    lead = start_ns
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("# fabric:"):
            line = re.sub(r"( changes=\d+)?$", r" clock=skip\1", line, count=1)
        ev = by_line.get(n)
        f = ev.fields if ev else {}
        if ev and ev.name in ("mmiowb", "read"):
            lead += step_ns
            last_wait = lead
            line += f" t={ev.ts_ns - int(f['wait' if ev.name == 'mmiowb' else 'cost']) + lead}"
        elif ev and ev.name in ("post", "drain", "arrive"):
            w = tr.writes[int(f["seq"])]
            if ev.name == "post":
                at_post[w.seq] = lead
            shift = at_post.get(w.seq, lead) if ev.name == "drain" else lead
            line = line.replace(f" t={f['t']}", f" t={int(f['t']) + shift}", 1)
            if ev.name != "drain" and w.post is not None:
                line += f" posted={w.post + at_post.get(w.seq, lead)}"
        leads[n], waited[n] = lead, last_wait
        out.append(line)
    return "\n".join(out) + "\n", leads, waited


class RacePictureTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)
        cls.browser = None
        try:
            cls.browser = svgcheck.Browser()
        except FileNotFoundError as e:
            cls.missing = str(e)

    @classmethod
    def tearDownClass(cls):
        if cls.browser:
            cls.browser.close()

    def setUp(self):
        if not self.browser:
            self.fail(self.missing)

    def _pages(self):
        """name -> (path of its race.html, the Drawing)."""
        pages = {}
        for name, text in recordings().items():
            d = timeline.draw(text, title=f"{name}: the first failing run, as traced", ring=ring())
            path = os.path.join(OUT, f"{name}.html")
            with open(path, "w", encoding="utf-8") as f:
                f.write(timeline.html_page(d, name))
            pages[name] = (path, d)
        return pages

    def _check_layout(self, path, name, page=True):
        for width in WIDTHS:
            for opened in (False, True):
                with self.subTest(page=name, width=width, opened=opened):
                    m = self.browser.measure(path, width, open_all=opened)
                    self.assertTrue(m["svgs"], "no picture shown")
                    for s in m["svgs"]:
                        self.assertEqual(s["overlaps"], [], "labels set over each other")
                        self.assertEqual(s["outside"], [], "labels outside the picture")
                    if page:
                        self.assertLessEqual(m["scrollWidth"], m["innerWidth"],
                                             "the page scrolls sideways")

    def test_recordings_are_stored(self):
        # Every lab's starter, and each kind of finding a failing run gives.
        names = recordings()
        for lab in ("doorbell", "posting", "modern"):
            self.assertIn(f"{lab}-starter", names)
        kinds = {timeline.draw(t, ring=ring()).finding.kind for t in names.values()}
        self.assertLessEqual({"stale-doorbell", "late-interrupt", "early-return"}, kinds)

    def test_reports_lay_out_cleanly_at_every_width(self):
        for name, (path, d) in self._pages().items():
            self.assertTrue(d.finding and d.finding.marked, f"{name}: nothing found")
            self._check_layout(path, name)

    def test_first_screen_shows_the_finding(self):
        for name, (path, d) in self._pages().items():
            want = {w for labels in d.finding.marked.values() for w in labels if w}
            for width, height in SCREENS:
                with self.subTest(page=name, width=width):
                    self.browser.open(path, width, height)
                    got = self.browser.eval(
                        "Array.from(document.querySelectorAll('svg g.marked text'))"
                        ".filter(t => t.checkVisibility()).map(t => {"
                        " const b = t.getBoundingClientRect();"
                        f" return [t.textContent, b.bottom <= {height} && b.top >= 0]; }})")
                    shown = {t for t, on_screen in got if on_screen}
                    self.assertEqual(want - shown, set(),
                                     "the finding's labels are not on the first screen")
                    # Named as the sentence names them: by their seq=.
                    for seq in d.finding.marked:
                        self.assertIn(f"seq={seq}", d.finding.text)
                        self.assertTrue(any(f"seq={seq}" in t for t in shown), seq)
                    if d.finding.kind == "late-interrupt":
                        self.assertTrue(self.browser.eval(
                            "Array.from(document.querySelectorAll('svg g.mmiosim-labels.late text'))"
                            ".some(t => t.checkVisibility() && t.textContent === 'late IRQ')"),
                            "the late interrupt is not labelled")
                    self.browser.screenshot(path, width, os.path.join(
                        OUT, f"{name}-{width}.png"), height)

    def test_repeated_rows_are_folded(self):
        path, d = self._pages()["stalled-doorbell"]
        groups = re.findall(r'class="mmiosim-group (queue|bridge)" data-count="(\d+)"', d.svg)
        self.assertTrue(any(int(n) >= timeline.FOLD_MIN for _, n in groups))
        self.assertIn("queue", {g for g, _ in groups})
        # Every write is still drawn (a dot each), inside one bar or on its own.
        self.assertEqual(d.svg.count('<g class="mmiosim-write'), d.excerpt_writes)
        self.assertLess(d.focus_writes, d.excerpt_writes)

    def test_a_write_that_never_arrived_is_drawn(self):
        # A call that returned while its interrupt disable sat in a stalled
        # queue past the trace's end (3 of the 16 posting wrong fixes' runs
        # of one batch): drawn up to the end, said to be still queued, not
        # "the excerpt cannot be drawn" (the first two) or left out of a
        # picture of the writes around it (the third).
        pages = self._pages()
        for name in ("posting-delay-jiffies", "posting-sleep-msleep-5",
                     "posting-delay-mdelay-20"):
            path, d = pages[name]
            seq = next(iter(d.finding.marked))
            self.assertEqual(d.warnings, [], name)
            self.assertIsNone(timeline.parse(recordings()[name], ring=ring()).writes[seq].arrive,
                              name)
            for svg in (d.svg, d.focus_svg, d.focus_narrow_svg):
                self.assertIn(f'data-seq="{seq}"', svg)
                self.assertIn("still queued at the end", svg)
            self.assertTrue(any(s.startswith("[the finding]") and "still in its CPU's queue"
                                in s for s in d.words), d.words)
            self.browser.open(path, 1280, 900)
            self.assertTrue(self.browser.eval(
                "Array.from(document.querySelectorAll('svg g.marked text'))"
                ".some(t => t.checkVisibility() && t.textContent.startsWith('still queued')"
                " && t.getBoundingClientRect().bottom <= 900)"),
                f"{name}: the first screen does not say the write is still queued")

    def test_it_is_said_in_words(self):
        for name, (path, d) in self._pages().items():
            for svg in (d.svg, d.focus_svg, d.focus_narrow_svg):
                self.assertRegex(svg, r"<title id=\"[^\"]+-title\">[^<]+</title><desc id=")
            self.assertEqual(len([s for s in d.words if s.startswith("[the finding]")]),
                             len(d.finding.marked), name)
            with open(path, encoding="utf-8") as f:
                page = f.read()
            self.assertIn("The picture in words", page)
            said = "Found" if d.finding.failure else "Shows"
            self.assertIn(f"<b>{said}:</b> {d.finding.text}", page.replace("&#x27;", "'"))

    def test_skip_clock_runs_lay_out_cleanly(self):
        # A stale doorbell and an early return, re-timed as under
        # mmiosim.clock=skip (as_skip_clock): the interrupts and returns,
        # moved by the lead, stay among the writes they happened between.
        for name in ("doorbell-starter", "posting-mmiowb-alone"):
            d = timeline.draw(as_skip_clock(recordings()[name])[0], title=f"{name} (skip)",
                              ring=ring())
            self.assertEqual(d.warnings, [], name)
            path = os.path.join(OUT, f"{name}-skip.html")
            with open(path, "w", encoding="utf-8") as f:
                f.write(timeline.html_page(d, name))
            self._check_layout(path, f"{name}-skip")

    def test_docs_figures_lay_out_cleanly(self):
        # The recorded figures, drawn as Documentation/sphinx/tracefig.py draws
        # them (960 px, scaled to the column), and the hand-drawn ones.
        for trace in sorted(glob.glob(os.path.join(FIGURES, "*-trace.txt"))):
            name = os.path.basename(trace)[:-4]
            with open(trace, encoding="utf-8") as f:
                svg = timeline.render_svg(timeline.parse(f.read(), ring=ring()), title=name, ident=name)
            path = os.path.join(OUT, f"docs-{name}.html")
            with open(path, "w", encoding="utf-8") as f:
                f.write("<!DOCTYPE html><html><head><meta charset='utf-8'><meta name='viewport'"
                        " content='width=device-width'><style>svg{max-width:100%;height:auto}"
                        f"</style></head><body>{svg}</body></html>")
            self._check_layout(path, name)
        # (Opened alone at its own size: the docs scale it to their column.)
        for fig in sorted(glob.glob(os.path.join(FIGURES, "*.svg"))):
            self._check_layout(fig, os.path.basename(fig), page=False)



class SkipClockTest(unittest.TestCase):
    """Every stored recording, re-timed as under mmiosim.clock=skip (the
    fabric's clock ahead of the lines' timestamps by a lead that grows
    during the run), is the same run on the fabric's clock: each write,
    wait and kernel event moved by the lead at its line, and the same
    finding. Needs no browser."""

    def test_recordings_under_a_growing_lead(self):
        for name, text in {**recordings(), **{
                os.path.basename(p): open(p, encoding="utf-8").read()
                for p in sorted(glob.glob(os.path.join(FIGURES, "*-trace.txt")))}}.items():
            with self.subTest(name):
                skip, leads, waited = as_skip_clock(text)
                was, now = timeline.parse(text, ring=ring()), timeline.parse(skip, ring=ring())
                for seq, w in was.writes.items():
                    if w.post is not None:
                        self.assertEqual(now.writes[seq].post - w.post, leads[min(w.lines)])
                for a, b in zip(was.spans, now.spans):
                    self.assertEqual((b.start - a.start, b.end - a.end),
                                     (leads[a.lineno], leads[a.lineno]))
                # Placed by the lead seen so far: never past the lead at the
                # line (but for the timestamps' rounding), and at least the
                # lead an mmiowb() or a read before it showed (exactly: its
                # end is t= plus its wait); a post or an arrival recorded
                # after it happened shows a little less.
                for a, b in zip(was.irqs + was.returns, now.irqs + now.returns):
                    self.assertLessEqual(waited[a.lineno], b.ts - a.ts, a)
                    self.assertLessEqual(b.ts - a.ts, leads[a.lineno] + timeline.ROUNDING_NS, a)
                d, e = timeline.draw(text, ring=ring()), timeline.draw(skip, ring=ring())
                self.assertEqual((e.finding.kind, sorted(e.finding.marked), e.summary,
                                  e.warnings), (d.finding.kind, sorted(d.finding.marked),
                                                d.summary, d.warnings))


class AxisTest(unittest.TestCase):
    def test_ticks_are_round_numbers_without_an_exponent(self):
        self.assertEqual(timeline._nice_step(65000), 10000)
        self.assertEqual([timeline._us_text(k * 0.1) for k in range(4)], ["0", "0.1", "0.2", "0.3"])
        self.assertEqual(timeline._us_text(2500000.0), "2500000")


if __name__ == "__main__":
    unittest.main()
