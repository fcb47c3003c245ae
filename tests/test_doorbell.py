"""The doorbell lab: the starter's race really happens, the fixes really fix it,
and the wrong fixes are really rejected. Counts, not timings, are asserted.

make check runs SEEDS seeds per variant; scripts/labstats runs 100 and prints
the table.
"""

import os
import subprocess
import unittest

from mmiolab.labspec import load_lab
from mmiolab.labtest import run_variant
from vmtest import fixture_floor, need_guest, report

LAB = load_lab("doorbell")
SEEDS = list(range(1, int(os.environ.get("MMIOLAB_LAB_SEEDS", "10")) + 1))
FIXTURES = sorted(f[:-6] for f in os.listdir(os.path.join(LAB.dir, "fixtures"))
                  if f.endswith(".patch"))


def _diff_lines(a: str, b: str) -> list[str]:
    out = subprocess.run(["diff", a, b], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line[:1] in "<>"]


class LabFilesTest(unittest.TestCase):
    def test_solutions_are_the_starter_plus_the_fix(self):
        starter = os.path.join(LAB.dir, "starter", "ringdrv.c")
        for name in ("mmiowb", "readback"):
            changed = _diff_lines(starter, os.path.join(LAB.dir, "solutions", name, "ringdrv.c"))
            self.assertTrue(changed, name)
            self.assertTrue(all(line.startswith(">") for line in changed),
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


class RaceTest(unittest.TestCase):
    def setUp(self):
        need_guest(self)

    def tally(self, variant, append=None):
        t = run_variant(LAB, variant, SEEDS, append=append)["race"]
        extra = f", median first failure at submission {t.median_first_failure}" \
            if t.first_failure else ""
        thr = f", {sorted(t.throughput)[len(t.throughput) // 2]:.0f} cmds/s" if t.throughput else ""
        report(f"{variant} {' '.join(append or [])}: failed {t.failed}/{t.runs}{extra}{thr}, "
               f"{t.seconds:.0f}s")
        return t

    def test_starter_fails_under_sn2_2004(self):
        t = self.tally("starter")
        self.assertEqual(t.failed, t.runs, "the starter must fail essentially every run")

    def test_starter_passes_on_a_pc(self):
        t = self.tally("starter", ["mmiosim.profile=pc"])
        self.assertEqual(t.failed, 0, "one ordered path hides the bug\n" + t.why())

    def test_starter_passes_under_5_2_semantics(self):
        t = self.tally("starter", ["mmiosim.locking=5.2"])
        self.assertEqual(t.failed, 0,
                         "spin_unlock() orders the doorbell under 5.2\n" + t.why())

    def test_solutions_pass(self):
        for name in ("mmiowb", "readback"):
            with self.subTest(solution=name):
                t = self.tally(f"solution:{name}")
                self.assertEqual(t.failed, 0, t.why())

    def test_solutions_pass_under_5_2_semantics(self):
        """A 2004-style fix stays correct when spin_unlock() orders too
        (and must not deadlock: the unlock runs mmiowb())."""
        for name in ("mmiowb", "readback"):
            with self.subTest(solution=name):
                t = self.tally(f"solution:{name}", ["mmiosim.locking=5.2"])
                self.assertEqual(t.failed, 0, t.why())

    def test_wrong_fixes_fail(self):
        for name in FIXTURES:
            with self.subTest(fixture=name):
                t = self.tally(f"fixture:{name}")
                self.assertGreaterEqual(t.failed, fixture_floor(t.runs),
                                        f"{t.runs - t.failed} of {t.runs} runs passed")


if __name__ == "__main__":
    unittest.main()
