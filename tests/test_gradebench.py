"""The grading benchmark's bookkeeping (scripts/mmiolab/gradebench.py), no guest:
the guest's CPU line as the harness library prints it, a QEMU run's split,
the ledger's rows adding up to what it measured, the table's checks, its
text and its saved figures. What the benchmark measures goes to notes,
never to assertions."""

import os
import subprocess
import tempfile
import unittest

from mmiolab import ROOT, gradebench, ktap
from mmiolab.gradebench import GuestCpu, Ledger, Row, Table
from mmiolab.labspec import load_lab
from test_harness import FakeGuest

NONCE = "0123456789abcdef0123456789abcdef"
# A guest's /proc/stat cpu lines (USER_HZ 100): user nice system idle iowait
# irq softirq steal guest guest_nice.
CHANNEL = (f"{NONCE} ok 4 cost\n"
           f"untagged {gradebench.GUEST_CPU}start cpu  1 0 1 1 0 0 0 0 0 0; end cpu  9 9 9 9 9 9 9\n"
           f"{NONCE} {gradebench.GUEST_CPU}start cpu  100 20 300 400 5 6 7 0 0 0; "
           f"end cpu  1100 20 2300 900 5 106 207 0 0 0\n"
           f"{NONCE} # mmiolab harness: end\n")


def canned() -> Table:
    """A doorbell-shaped grade: host phases, two guests split at the boot."""
    t = Table(lab="doorbell", solution="mmiowb", own=3.0, children=40.0, wall=30.0,
              qemu=36.0, boots=2, verdict="100/100, graded")
    t.rows = [Row("intake (bounded child)", own=0.1, children=0.4, wall=0.5),
              Row("module build (confined: sandbox, make, gcc)", own=0.2, children=3.5,
                  wall=4.0)]
    g = GuestCpu(user=10.0, kernel=30.0, idle=5.0)
    t.rows += gradebench.qemu_rows("visible guest", 20.0, 1.0, 15.0, 4.0, 3.0, g, 0.1)
    t.rows += gradebench.qemu_rows("hidden guest", 16.0, 0.8, 10.0, None, None, None, 0.1)
    t.rows.append(Row(gradebench.BETWEEN, own=3.0 - 0.1 - 0.2 - 1.0 - 0.8, children=0.1))
    return t


class GuestCpuTest(unittest.TestCase):
    def test_the_line_tagged_with_the_runs_nonce_is_read(self):
        g = gradebench.guest_cpu(CHANNEL, NONCE)
        self.assertEqual((g.user, g.kernel, g.idle), (10.0, 23.0, 5.0))
        self.assertIsNone(gradebench.guest_cpu(CHANNEL, "f" * 32))
        self.assertIsNone(gradebench.guest_cpu(f"{NONCE} {gradebench.GUEST_CPU}start cpu 1 2",
                                               NONCE))

    def test_the_harness_library_prints_it(self):
        """The library's line, as a harness run on the faked guest prints it,
        is what guest_cpu reads (the fake reads the host's /proc/stat)."""
        spec = load_lab("doorbell")
        g = FakeGuest(spec.module, [n[:-2] for n in os.listdir(os.path.join(spec.dir, "tests"))
                                    if n.endswith(".c")])
        self.addCleanup(g.close)
        g.write("job/nonce", NONCE + "\n")
        with open(os.path.join(spec.dir, "tests", "harness.sh")) as f:
            g.run(f.read(), {"SEEDS": "1", "CMDS": "10"})
        channel = g.read("channel")
        self.assertIsNotNone(gradebench.guest_cpu(channel, NONCE), channel)
        tests = ktap.expect(ktap.parse(channel, nonce=NONCE), [t.name for t in spec.ktap_tests])
        self.assertTrue(all(t.status is ktap.Status.PASS for t in tests.values()), channel)
        self.assertNotIn("guest cpu", ktap.parse(channel, nonce=NONCE).root.find("cost").text())


class TableTest(unittest.TestCase):
    def test_a_qemu_run_is_split_at_the_boot_and_by_the_guests_clock(self):
        rows = gradebench.qemu_rows("visible guest", 20.0, 1.0, 15.0, 4.0, 3.0,
                                    GuestCpu(user=10.0, kernel=30.0, idle=5.0), 0.1)
        by = {r.phase: r for r in rows}
        self.assertEqual(by["visible guest: QEMU boot, to the harness start"].children, 4.0)
        after = by["visible guest: QEMU, harness start to exit"]
        self.assertEqual((after.children, after.wall), (16.0, 12.0))
        user, kernel = [r for r in rows if r.detail]
        self.assertAlmostEqual(user.children, 4.0)
        self.assertAlmostEqual(kernel.children, 12.0)
        self.assertAlmostEqual(by["visible guest: the grader's threads reading the guest"].own,
                               0.9)

    def test_the_rows_add_up_to_the_measured_total(self):
        t = canned()
        t.check()
        self.assertAlmostEqual(t.summed().cpu, 43.0)
        t.rows[0].children += 1.0
        with self.assertRaisesRegex(gradebench.BenchError, "add up to 44.000"):
            t.check()

    def test_a_split_must_add_up_to_its_row(self):
        t = canned()
        next(r for r in t.rows if r.detail).children += 1.0
        with self.assertRaisesRegex(gradebench.BenchError, "details of"):
            t.check()

    def test_the_text_and_the_saved_figures(self):
        t = canned()
        text = gradebench.render(t)
        self.assertIn("bench-grade: lab doorbell, solution mmiowb: 100/100, graded", text)
        self.assertRegex(text, r"visible guest: QEMU boot, to the harness start +0\.00 +4\.00 "
                               r"+4\.00 +3\.0")
        self.assertRegex(text, r"\n {4}guest user \(by the guest's clock\) +4\.00 +4\.00")
        self.assertRegex(text, r"sum of the rows +3\.00 +40\.00 +43\.00")
        self.assertIn("QEMU (2 boots): 36.00 CPU-s", text)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bench.json")
            gradebench.save([t], path, {"cpus": 2})
            (back,) = gradebench.load(path)
            self.assertEqual(back, t)
            with open(path, "w") as f:
                f.write('{"tables": [{"lab": "x", "bogus": 1}]}')
            with self.assertRaisesRegex(gradebench.BenchError, "not bench-grade figures"):
                gradebench.load(path)


class LedgerTest(unittest.TestCase):
    def test_nested_phases_and_children_add_up_to_what_was_measured(self):
        """Each moment goes to the innermost phase; children's CPU to the phase
        that reaped them; the rows telescope to the whole."""
        led = Ledger()
        t0 = led.last = gradebench._now()
        with led.phase("outer"):
            sum(range(200000))
            with led.phase("inner"):
                subprocess.run(["/usr/bin/python3", "-c", "sum(range(2000000))"], check=True)
            sum(range(200000))
        led._charge()
        t1 = led.last
        rows = led.rows
        self.assertEqual(set(rows), {"outer", "inner", gradebench.BETWEEN})
        self.assertEqual(rows["outer"].children, 0.0)
        self.assertGreater(rows["inner"].children, 0.0)
        total = sum(r.cpu for r in rows.values())
        self.assertAlmostEqual(total, (t1.own - t0.own) + (t1.children - t0.children), places=6)

    def test_untraced_harness_keeps_the_library_first(self):
        spec = load_lab("posting")
        with tempfile.TemporaryDirectory() as tmp:
            path = gradebench.untraced_harness(spec.harness, os.path.join(tmp, "h.sh"))
            with open(path) as f:
                lines = [ln for ln in f.read().splitlines()
                         if ln.strip() and not ln.startswith("#")]
        self.assertTrue(lines[0].startswith(". /lib/mmiolab/"))
        self.assertTrue(lines[1].startswith('traced() { check "$@"; }'))

    def test_every_wrapped_phase_is_still_the_graders(self):
        for mod, attr, _ in gradebench.PHASES:
            with self.subTest(f"{mod.__name__}.{attr}"):
                self.assertTrue(callable(getattr(mod, attr, None)))


if __name__ == "__main__":
    unittest.main()
