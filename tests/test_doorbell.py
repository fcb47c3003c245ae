"""The doorbell lab beyond the claims every lab makes (tests/test_labs.py): its
files, and the fabrics where its bug must disappear (a PC; Linux 5.2's
spin_unlock()) or where its 2004-style fixes must still hold (5.2). Counts,
not timings, are asserted.
"""

import os
import subprocess
import unittest

from mmiolab.labspec import load_lab
from mmiolab.labtest import run_variant, run_variants
from kitcfg import CFG
from vmtest import need_guest, report

LAB = load_lab("doorbell")
SEEDS = list(range(1, int(os.environ.get("MMIOLAB_LAB_SEEDS", "10")) + 1))
FIXTURES = sorted(f[:-6] for f in os.listdir(os.path.join(LAB.dir, "fixtures"))
                  if f.endswith(".patch"))


class LabFilesTest(unittest.TestCase):
    def test_solutions_are_the_starter_plus_the_fix(self):
        self.assertEqual(LAB.solutions, ("mmiowb", "readback"))
        for name in LAB.solutions:
            with open(LAB.solution_patch(name)) as f:
                hunks = f.read().split("\n+++ ", 1)[1].splitlines()[1:]
            changed = [line for line in hunks if line[:1] in "+-"]
            self.assertTrue(changed, name)
            self.assertTrue(all(line.startswith("+") for line in changed),
                            f"{name}: the solution removes starter lines")
            code = [c for c in changed if not c[1:].strip().startswith(("/*", "*"))]
            self.assertLessEqual(len(code), 2, f"{name}: more than the fix changed: {code}")

    def test_fixtures_apply_to_the_starter(self):
        self.assertGreaterEqual(len(FIXTURES), 4)
        for name in FIXTURES:
            res = subprocess.run(["patch", "--dry-run", "-F0", "-p1", "-i",
                                  os.path.join(LAB.dir, "fixtures", f"{name}.patch")],
                                 cwd=os.path.join(LAB.dir, "starter"), capture_output=True,
                                 text=True)
            self.assertEqual(res.returncode, 0, f"{name}: {res.stdout}{res.stderr}")


class FabricTest(unittest.TestCase):
    """Where the doorbell bug must disappear, and where 2004-style fixes must hold."""
    def setUp(self):
        need_guest(self)

    def tally(self, variant, append=None):
        t = run_variant(LAB, variant, SEEDS, append=append, cfg=CFG)["race"]
        thr = f", {sorted(t.throughput)[len(t.throughput) // 2]:.0f} cmds/s" if t.throughput else ""
        report(f"{variant} {' '.join(append or [])}: failed {t.failed}/{t.runs}{thr}, "
               f"{t.seconds:.0f}s")
        return t

    def test_starter_passes_on_a_pc(self):
        t = self.tally("starter", ["mmiosim.profile=pc"])
        self.assertEqual(t.failed, 0, "one ordered path hides the bug\n" + t.why())

    def test_starter_passes_under_5_2_semantics(self):
        t = self.tally("starter", ["mmiosim.locking=5.2"])
        self.assertEqual(t.failed, 0,
                         "spin_unlock() orders the doorbell under 5.2\n" + t.why())

    def test_solutions_pass_under_5_2_semantics(self):
        """A 2004-style fix stays correct when spin_unlock() orders too (and must
        not deadlock: the unlock runs mmiowb(), which takes no lock)."""
        tallies = run_variants(LAB, ["solution:mmiowb", "solution:readback"], SEEDS,
                               append=["mmiosim.locking=5.2"], cfg=CFG)
        for name, t in tallies.items():
            with self.subTest(solution=name):
                report(f"{name} locking=5.2: failed {t['race'].failed}/{t['race'].runs}")
                self.assertEqual(t["race"].failed, 0, t["race"].why())


if __name__ == "__main__":
    unittest.main()
