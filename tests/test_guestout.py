"""Reading guest output cannot stall or exhaust the grader (issue 24).

Every parser of what a guest prints (ktap.py, timeline.py, the harness line,
the console scan) reads lines of at most MAX_LINE characters with patterns
that do not backtrack, recordings are inflated under a cap, and the grader
runs all of it in one bounded child (guestout.read_bounded). Here:

- the rewritten line readers give what the old regular expressions gave, on
  thousands of random short lines (where the old ones were fast);
- the inputs that wedged the old parsers (a result line with a million
  spaces, a recording that inflates to one 100 MiB line, a 1 GiB bomb) are
  read exactly, under the cap;
- a fuzz test feeds random and adversarial guest output through the bounded
  child: every one of them is read within its time and memory caps;
- a child that is stopped gives a graded, explained failure.
"""

import base64
import os
import random
import re
import shutil
import tempfile
import unittest
import zlib

from mmiolab import guestout, ktap, timeline
from kitcfg import BUILD, TREE, ring

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "ktap")
NONCE = "5f0c1a9e3b7d42c8a6e1f90b2d4c7e38"
S = ktap.Status

# The patterns the line readers replace (fine on short lines, which is where
# they are compared).
OLD_RESULT = re.compile(r"^(\s*)(ok|not ok) (\d+)(?: - | -$| |$)([^#]*?)\s*(?:#\s*(.*?))?\s*$")
OLD_SUBTEST = re.compile(r"^(\s*)# Subtest: (.*?)\s*$")
OLD_VALUES = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)=(\S+)")
OLD_FIELDS = re.compile(r"(\w+)=(\S+)")
OLD_LINE = re.compile(
    r"^\s*(?P<task>.*?)-(?P<pid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[(?P<tcpu>\d+)\]\s+"
    r"(?:(?P<flags>[^\s:]{4,6})\s+)?(?P<ts>\d+\.\d+):\s+(?P<event>\w+):\s*(?P<rest>.*)$")
OLD_HUNG = re.compile(r"INFO: task .* blocked for more than")


def data(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


def tagged(*lines):
    return "".join(f"{NONCE} {line}\n" for line in lines)


def recording(chunks, number=1):
    """A channel's recording (vm/record's wire form) of the bytes in chunks."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    raw = b"".join(c.compress(x) for x in chunks) + c.flush()
    b = base64.b64encode(raw).decode()
    return (f"=== mmiolab record {number} begin ===\n"
            + "\n".join(b[i:i + 76] for i in range(0, len(b), 76))
            + f"\n=== mmiolab record {number} end ===\n")


def random_line(rng, alphabet, n):
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(n)))


class LineReadersTest(unittest.TestCase):
    """The linear readers agree with the patterns they replace."""

    def test_result_and_subtest_lines(self):
        rng = random.Random(24)
        words = ["ok", "not ok", " ", "  ", "1", "12", "-", " - ", "#", "# SKIP", "x", "\t",
                 "# Subtest:", "# Subtest: ", "name", "=", "\u00a0"]
        for _ in range(20000):
            line = "".join(rng.choice(words) for _ in range(rng.randrange(8)))
            old = OLD_RESULT.match(line)
            new = ktap._result(line)
            with self.subTest(line=line):
                self.assertEqual(old is None, new is None)
                if old:
                    self.assertEqual([old.group(i) for i in range(1, 6)],
                                     [new.group(i) for i in range(1, 6)])
                old = OLD_SUBTEST.match(line)
                self.assertEqual(old.group(2) if old else None, ktap._subtest(line))

    def test_key_values(self):
        rng = random.Random(25)
        for _ in range(20000):
            text = random_line(rng, "ab1_.=- :x\t=", 24)
            with self.subTest(text=text):
                self.assertEqual(OLD_VALUES.findall(text), ktap.key_values(text))

    def test_trace_fields_and_lines(self):
        rng = random.Random(26)
        for _ in range(20000):
            text = random_line(rng, "ab1_=- :\u00e9\t=", 24)
            with self.subTest(text=text):
                self.assertEqual(dict(OLD_FIELDS.findall(text)), timeline._fields(text))
        sample = ["    ringtest-55 [001] d.... 1.280073: mmiosim_post: win=0 cpu=1 seq=6",
                  "<idle>-0    [000] d.h.. 1.280079: mmiosim_drain: cpu=1 seq=6 t=12 overtaken",
                  "  a-b-7 (  12) [1] 2.5: x: y", " - -1 [1] 1.1: e:"]
        for _ in range(5000):
            sample.append(random_line(rng, "a-1 [].:( )d", 30))
        for line in sample:
            old = OLD_LINE.match(line)
            new = timeline.LINE_RE.match(line.lstrip())
            with self.subTest(line=line):
                self.assertEqual(old.groupdict() if old else None,
                                 new.groupdict() if new else None)

    def test_console_scan(self):
        rng = random.Random(27)
        for _ in range(5000):
            line = random_line(rng, ["INFO: task ", " blocked for more than", "x", " "], 8)
            with self.subTest(line=line):
                hung = [e.kind for e in ktap.scan_console(line)] == ["hung"]
                self.assertEqual(bool(OLD_HUNG.search(line)), hung)


class WorstInputsTest(unittest.TestCase):
    """What wedged the old parsers is read, exactly, within the caps."""

    def test_result_line_with_a_million_spaces(self):
        text = tagged("KTAP version 1", "1..1", "ok 1 race" + " " * 1_000_000 + "x")
        r = ktap.parse(text, NONCE)
        race = r.expect(["race"])["race"]
        self.assertEqual(race.status, S.CRASHED)
        self.assertEqual(r.root.subtests[0].status, S.CRASHED)
        self.assertIn("a line of 1000043 characters was not read (over the 4096-character "
                      "cap)", r.root.text())

    def test_a_long_line_under_the_cap_is_read(self):
        r = ktap.parse(tagged("KTAP version 1", "1..1", "ok 1 race" + " " * 4000 + "# x"),
                       NONCE)
        self.assertEqual(r.expect(["race"])["race"].status, S.PASS)
        self.assertEqual(r.expect(["race"])["race"].reason, "x")

    def test_untagged_long_line_is_untrusted(self):
        r = ktap.parse(tagged("KTAP version 1", "1..1", "ok 1 race") + "x" * 100000 + "\n",
                       NONCE)
        self.assertEqual(r.expect(["race"])["race"].status, S.PASS)
        self.assertEqual(r.untrusted_lines, 1)
        self.assertEqual(r.untrusted_sample, ["x" * 200])

    def test_recording_of_one_long_line(self):
        recs = timeline.recordings_in(recording([b" " * (1 << 20)] * 15 + [b"x"]))
        self.assertEqual(len(recs), 1)
        self.assertEqual(len(recs[0].text), (15 << 20) + 1)
        d = timeline.draw(recs[0].text, ring=ring())
        self.assertEqual(d.svg, "")
        self.assertEqual(d.finding, None)

    def test_recording_bomb(self):
        recs = timeline.recordings_in(recording([b"\0" * (1 << 20)] * 1024))
        self.assertEqual([(r.text, r.problem) for r in recs],
                         [("", "it was not read: it inflates to more than 16 MiB")])

    def test_gunzip(self):
        one = zlib.compress(b"a", wbits=31)
        two = zlib.compress(b"bc", wbits=31)
        self.assertEqual(timeline.gunzip(one + two), b"abc")
        self.assertEqual(timeline.gunzip(b"x" * 0 + one, cap=1), b"a")
        with self.assertRaises(timeline.TooLarge):
            timeline.gunzip(two, cap=1)
        with self.assertRaises(EOFError):
            timeline.gunzip(two[:-4])

    def test_recorded_trace_still_draws(self):
        with open(os.path.join(os.path.dirname(DATA), "traces", "stalled-doorbell.txt.gz"),
                  "rb") as f:
            raw = f.read()
        b = base64.b64encode(raw).decode()
        ch = "=== mmiolab record 1 begin ===\n" + b + "\n=== mmiolab record 1 end ===\n"
        recs = timeline.recordings_in(ch)
        self.assertEqual(recs[0].problem, "")
        self.assertTrue(timeline.draw(recs[0].text, ring=ring()).svg)

    def test_a_header_of_digits_int_refuses_is_no_number(self):
        # str.isdigit() takes "\u00b2", int() refuses it: the reader crashed.
        with open(os.path.join(os.path.dirname(DATA), "traces", "posting-starter.txt.gz"),
                  "rb") as f:
            trace = zlib.decompress(f.read(), wbits=31)
        ch = recording(["# card_irq: \u00b2\n# fabric_lead_ns: \u00b2\n".encode(), trace])
        out = tempfile.mkdtemp(prefix="picture-", dir=BUILD)
        self.addCleanup(shutil.rmtree, out, ignore_errors=True)
        pic = guestout.race_picture(ch, out, "posting", TREE.src)
        self.assertEqual("early-return", timeline.draw(
            timeline.recordings_in(ch)[0].text, ring=ring()).finding.kind)
        self.assertIsNotNone(pic)

    def test_a_disable_that_never_arrived_gets_its_picture(self):
        # A posting wrong fix's run whose interrupt disable was still queued
        # when the trace ends: the report carries race.svg, race.html and the
        # picture in words (it had none: nothing in it was complete).
        with open(os.path.join(os.path.dirname(DATA), "traces", "posting-delay-jiffies.txt.gz"),
                  "rb") as f:
            b = base64.b64encode(f.read()).decode()
        ch = "=== mmiolab record 1 begin ===\n" + b + "\n=== mmiolab record 1 end ===\n"
        out = tempfile.mkdtemp(prefix="picture-", dir=BUILD)
        self.addCleanup(shutil.rmtree, out, ignore_errors=True)
        pic = guestout.race_picture(ch, out, "posting", TREE.src)
        self.assertIsNotNone(pic)
        self.assertTrue(os.path.exists(os.path.join(out, "race.svg")))
        self.assertIn("INT_ENABLE (seq=513)", pic.text)
        self.assertIn("[the finding] seq 513: CPU 0 writes 0 to INT_ENABLE", pic.text)
        self.assertIn("still in its CPU's queue", pic.text)
        self.assertIn("still queued at the end", pic.html)


def adversarial_outputs(rng):
    """(label, channel, console): guest output shaped to hurt the host's parsers."""
    head = tagged("KTAP version 1", "1..4")
    big = 1 << 20
    yield "result line of spaces", head + tagged("ok 1 x" + " " * big + "x"), ""
    yield "subtest line of spaces", head + tagged("# Subtest: a" + " " * big + "x"), ""
    yield "directive of spaces", head + tagged("ok 1 x #" + " " * big + "x"), ""
    yield "diagnostic of one word", head + tagged("# " + "a" * big), ""
    yield "diagnostic of keys", head + tagged("# " + "a=" * (big // 2)), ""
    yield "deep nesting", head + tagged(*["  " * i + "KTAP version 1" for i in range(5000)]), ""
    yield "plan of a billion", tagged("KTAP version 1", "1..1000000000"), ""
    yield "a million short lines", head + tagged(*["ok 1 x"] * 200000), ""
    yield "console of INFO: task", "", "INFO: task " * (big // 11)
    yield "console of NMI watchdog", "", "NMI watchdog: " * (big // 14)
    yield "console of blanks", "", " " * big
    yield "console timestamps", "", "[" + " " * big + "1.2]"
    yield "recording, one line", head + recording([b" " * (1 << 20)] * 100 + [b"x"]), ""
    yield "recording, bomb", head + recording([b"\0" * (1 << 20)] * 1024), ""
    yield "recording, trace-like line", head + recording(
        [b"-1 [1] 1.1: mmiosim_post: " + b"a" * (1 << 20)] + [b"\n-" + b" " * 5000] * 200), ""
    with open(os.path.join(os.path.dirname(DATA), "traces", "posting-starter.txt.gz"),
              "rb") as f:
        trace = zlib.decompress(f.read(), wbits=31)
    post = b"  posttest-74 [000] d.... 9.000000: mmiosim_post: win=0 cpu=0 seq=9999 off=0x1c "
    yield "recording, malformed event", head + recording(
        [trace, post + b"val=0x1 t=zz"]), ""
    yield "recording, time past u64", head + recording(
        [trace, post + b"val=0x1 t=1 posted=" + b"9" * 400]), ""
    yield "recording never ends", head + "=== mmiolab record 1 begin ===\n" + "QUFB" * big, ""
    yield "binary", bytes(rng.randrange(256) for _ in range(big)).decode("latin-1"), \
        bytes(rng.randrange(256) for _ in range(big)).decode("latin-1")
    for i in range(8):
        pieces = ["ok ", "not ok ", "1", " - ", "#", " ", "KTAP version 1", "# Subtest: ",
                  "1..", "\n", NONCE + " ", "=", "a", "-", "[", "]", ".", ":", "\t", "\r"]
        text = "".join(rng.choice(pieces) for _ in range(200000))
        yield f"random {i}", text, text


class FuzzTest(unittest.TestCase):
    """Random and adversarial guest output through the grader's bounded reader:
    each is read whole (no stop at the caps), with the verdict the rules give."""

    def test_fuzz_under_the_caps(self):
        rng = random.Random(2424)
        out = tempfile.mkdtemp(prefix="fuzz-", dir=BUILD)
        self.addCleanup(shutil.rmtree, out, ignore_errors=True)
        for label, channel, console in adversarial_outputs(rng):
            with self.subTest(label):
                g = guestout.read_bounded(channel, console, NONCE, out, "fuzz", TREE.src,
                                          timeout=60, memory=1 << 30)
                self.assertEqual(g.problem, "")
                race = g.parsed.expect(["race"])["race"]
                self.assertNotEqual(race.status, S.PASS)
                self.assertEqual(os.path.exists(os.path.join(out, "race.svg")), False)

    def test_recorded_runs_read_the_same_bounded(self):
        for ch, co in (("pass.channel.log", "pass.console.log"),
                       ("race-fail.channel.log", "crash.console.log"),
                       ("crash.channel.log", "crash.console.log")):
            with self.subTest(ch):
                a = guestout.read(data(ch), data(co), NONCE)
                b = guestout.read_bounded(data(ch), data(co), NONCE)
                self.assertEqual(b.problem, "")
                self.assertEqual(a.parsed.to_dict(), b.parsed.to_dict())
                self.assertEqual((a.events, a.excerpt, a.info), (b.events, b.excerpt, b.info))

    def test_a_stopped_reader_is_a_graded_failure(self):
        g = guestout.read_bounded(data("pass.channel.log"), data("pass.console.log"), NONCE,
                                  memory=16 << 20)
        self.assertTrue(g.problem.startswith("the guest's output was not read: reading it "
                                             "failed"), g.problem)
        self.assertTrue(g.problem.endswith("the grader reads a run's output with at most 60s "
                                           "and 16 MiB"), g.problem)
        self.assertEqual({n: t.status for n, t in g.parsed.expect(["race", "cost"]).items()},
                         {"race": S.CRASHED, "cost": S.CRASHED})
        self.assertEqual(g.events, [])


BEGIN = ("# mmiolab harness: lab=doorbell module=ringdrv cpus=2 seeds=1 2 profile=sn2 "
         "route_ns=800,4000 jitter_ns=5000 bridge_ns=1000 read_ns=10000 stall_ns=0 "
         "stall_ppm=0 seed=1 locking=2004")


def fabric(line, set_seed="1", indent="  "):
    """A fabric line of vm/harness-lib.sh (fabric_line) after a run."""
    params = BEGIN.split("cpus=2 seeds=1 2 ", 1)[1]
    return f"{indent}# mmiolab fabric: set_seed={set_seed} {params}".replace(*line)


class FabricSettingsTest(unittest.TestCase):
    """The settings the harness reads again after each run against those it
    read before any driver was loaded (issue 33: a module that changed one
    byte of them passed a race it should have failed)."""

    def changed(self, *lines):
        return guestout.fabric_changed([BEGIN, "ok 1 load_unload", *lines])

    def test_unchanged(self):
        self.assertEqual(self.changed(fabric(("", "")), fabric(("seed=1", "seed=2"), "2"),
                                      fabric(("", ""), indent="")), "")

    def test_each_change_is_named(self):
        for was, now, said in (("locking=2004", "locking=5.2", "locking 2004 -> 5.2"),
                               ("profile=sn2", "profile=pc", "profile sn2 -> pc"),
                               ("route_ns=800,4000", "route_ns=800,800",
                                "route_ns 800,4000 -> 800,800"),
                               ("stall_ppm=0", "stall_ppm=7", "stall_ppm 0 -> 7"),
                               (" seed=1 ", " seed=9 ", "seed 1 -> 9")):
            with self.subTest(now):
                self.assertEqual(self.changed(fabric(("", "")), fabric((was, now))), said)

    def test_a_change_of_clock_is_named(self):
        """The fabric's clock (mmiosim.clock, on a kernel that has it): a
        change during the run is flagged like any other."""
        begin = BEGIN + " clock=skip changes=0"

        def after(clock):
            return fabric(("", "")) + f" clock={clock} changes=0"
        self.assertEqual(guestout.fabric_changed([begin, after("skip")]), "")
        self.assertEqual(guestout.fabric_changed([begin, after("real")]), "clock skip -> real")

    def test_a_change_undone_is_counted(self):
        """The kernel counts every change of the settings (changes=N); the
        harness says how many it made (harness_changes=N). One more, even
        put back, is a change; the harness's own are not."""
        begin = BEGIN + " changes=4"

        def line(harness, kernel):
            return fabric(("", ""), indent="").replace(
                "# mmiolab fabric: ", f"# mmiolab fabric: harness_changes={harness} ") \
                + f" changes={kernel}"
        self.assertEqual(guestout.fabric_changed([begin, line(3, 7)]), "")
        self.assertEqual(guestout.fabric_changed([begin, line(3, 9)]),
                         "5 change(s) of the settings counted by the kernel, "
                         "3 made by the harness")
        # An older kernel or harness without the counts: nothing to compare.
        self.assertEqual(guestout.fabric_changed([BEGIN, line(3, 9)]), "")

    def test_an_unreadable_file_is_a_change(self):
        self.assertIn("locking 2004 -> (unreadable)", self.changed(
            "  # mmiolab fabric: set_seed=1 cat: can't open '/sys/kernel/debug/mmiosim/params'"))

    def test_a_faulted_store_is_named(self):
        console = ("BUG: unable to handle page fault for address: ffffffff816fe3a4\n"
                   "mmiosim: 0xffffffff816fe3a4 is in the fabric's model, read-only after "
                   "boot: a store there would change how writes are ordered\n")
        self.assertEqual(guestout.fabric_changed([BEGIN], console),
                         "a store to them faulted (the console log's oops)")
        self.assertEqual(guestout.read(tagged(BEGIN), console, NONCE).fabric_changed,
                         "a store to them faulted (the console log's oops)")

    def test_a_faulted_store_to_the_counters_is_named(self):
        console = ("BUG: unable to handle page fault for address: ffffffff816fe500\n"
                   "mmiosim: 0xffffffff816fe500 is in the ring card's counters, read-only "
                   "after boot: a store there would change a test's verdict\n")
        self.assertEqual(guestout.fabric_changed([BEGIN], console),
                         "a store to the ring card's counters faulted (the console log's oops)")

    def test_no_baseline_no_verdict(self):
        """Without the begin line's settings there is nothing to compare with
        (a harness that never began reports its tests missing anyway)."""
        self.assertEqual(guestout.fabric_changed([fabric(("locking=2004", "locking=5.2"))]),
                         "")

    def test_the_lines_leave_the_results_alone(self):
        """The fabric lines are KTAP diagnostics: the results parse the same."""
        plain = data("pass.channel.log")
        lines = plain.splitlines(keepends=True)
        at = [i for i, line in enumerate(lines) if "   ok " in line]
        self.assertTrue(at)
        for i in reversed(at):
            lines.insert(i + 1, tagged(fabric(("", ""))))
        with_lines = "".join(lines)
        a, b = guestout.read(plain, "", NONCE), guestout.read(with_lines, "", NONCE)
        self.assertEqual({t["name"]: t["status"] for t in a.parsed.to_dict()["root"]["subtests"]},
                         {t["name"]: t["status"] for t in b.parsed.to_dict()["root"]["subtests"]})
        self.assertEqual(b.fabric_changed, "")


if __name__ == "__main__":
    unittest.main()
