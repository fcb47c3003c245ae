"""The fabric benchmark module builds with Kbuild, runs in the guest and reports
every measurement. Its figures go to notes, not assertions (machines are noisy);
the overtake count is asserted only where it is exact: zero under pc."""

import os
import re
import subprocess
import unittest

from mmiolab import ROOT
from vmtest import need_guest, report

KIT = os.path.join(ROOT, "scripts", "kit")


def bench(*append: str) -> str:
    cmd = ["/usr/bin/python3", KIT, "bench"] + [f"--append={a}" for a in append]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode:
        raise AssertionError(res.stdout + res.stderr)
    return res.stdout


class BenchTest(unittest.TestCase):
    def setUp(self):
        need_guest(self)

    def test_sn2_reports_costs_and_overtakes(self):
        out = bench()
        self.assertIn("ok 1 mmiosim_bench", out)
        ratios = [int(r) / 100 for r in re.findall(r"ratio_x100=(\d+)", out)]
        self.assertGreaterEqual(len(ratios), 2, out)
        self.assertRegex(out, r"handoffs=10000 overtakes=\d+")
        report("bench: " + "; ".join(line.strip("# ") for line in out.splitlines() if "#" in line))

    def test_pc_never_overtakes(self):
        out = bench("mmiosim.profile=pc")
        self.assertIn("handoffs=10000 overtakes=0 ", out)

    def test_no_window_measures_the_accessor_alone(self):
        out = bench("mmiosim.card=0")
        self.assertIn("no simulated window", out)
        self.assertRegex(out, r"writel to RAM: \d+ ps with the fabric hook, \d+ ps without")
        self.assertRegex(out, r"spin_lock\+spin_unlock: \d+ ps with the mmiowb\(\) bookkeeping, "
                              r"\d+ ps without")
