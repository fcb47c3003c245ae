"""The posting and modern labs: each starter really fails, each reference
solution really passes, each wrong-fix fixture is really rejected, and the
grader scores both ends of a lab as its lab.toml says. Counts, not timings.

make check runs SEEDS seeds per variant; scripts/labstats --lab LAB runs 100
and prints the table. (The doorbell lab has its own tests/test_doorbell.py.)
"""

import glob
import os
import shutil
import subprocess
import tempfile
import unittest

from mmiolab import BUILD, kernel
from mmiolab.grade import GradeOptions, grade_batch
from mmiolab.labspec import LABS_DIR, lab_names, load_lab
from mmiolab.labtest import run_variant, variant_source, variants
from vmtest import fixture_floor, need_guest, report

SEEDS = list(range(1, int(os.environ.get("MMIOLAB_LAB_SEEDS", "5")) + 1))


class LabClaims:
    """Mixed into one TestCase per lab; LAB names the lab."""
    LAB = ""

    @classmethod
    def setUpClass(cls):
        cls.spec = load_lab(cls.LAB)

    def tally(self, variant):
        tallies = run_variant(self.spec, variant, SEEDS)
        for t in tallies.values():
            first = f", median first failure at {t.median_first_failure}" if t.first_failure else ""
            report(f"{self.LAB} {variant} {t.test}: failed {t.failed}/{t.runs}{first}, "
                   f"{t.seconds:.0f}s")
        return tallies

    # -- files, no guest
    def test_lab_files(self):
        self.assertTrue(self.spec.per_seed_tests)
        fixtures = [v for v in variants(self.spec) if v.startswith("fixture:")]
        self.assertGreaterEqual(len(fixtures), 3)
        with tempfile.TemporaryDirectory() as tmp:
            for v in fixtures:
                with self.subTest(fixture=v):
                    work = os.path.join(tmp, v.split(":")[1])
                    os.makedirs(work)
                    src = variant_source(self.spec, v, work)    # patch -F0 must apply
                    with open(self.spec.fixture_base_path) as a, open(src) as b:
                        self.assertNotEqual(a.read(), b.read())
                    with open(os.path.join(self.spec.dir, "fixtures", v.split(":")[1] + ".patch")) as f:
                        self.assertTrue(f.readline().startswith("Wrong fix"), "a one-line why first")
        harness = os.path.join(self.spec.dir, "tests", "harness.sh")
        self.assertTrue(shutil.which("shellcheck"), "shellcheck missing: run make deps")
        res = subprocess.run(["shellcheck", "-s", "sh", harness], capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, res.stdout)

    # -- in the guest
    def test_starter_fails_every_race_test(self):
        need_guest(self)
        for t in self.tally("starter").values():
            self.assertEqual(t.failed, t.runs, f"{t.test}: the starter must fail every run")

    def test_solutions_pass(self):
        need_guest(self)
        for v in variants(self.spec):
            if v.startswith("solution:"):
                with self.subTest(solution=v):
                    for t in self.tally(v).values():
                        self.assertEqual(t.failed, 0, f"{v} {t.test}\n{t.why()}")

    def test_wrong_fixes_fail(self):
        need_guest(self)
        for v in variants(self.spec):
            if v.startswith("fixture:"):
                with self.subTest(fixture=v):
                    worst = max(t.failed for t in self.tally(v).values())
                    self.assertGreaterEqual(worst, fixture_floor(len(SEEDS)))

    def test_grader_scores_starter_and_solution(self):
        need_guest(self)
        main = self.spec.files[0]
        solution = next(v for v in variants(self.spec) if v.startswith("solution:"))
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            entries = []
            for sid, variant in (("starter", "starter"), ("solution", solution)):
                os.makedirs(os.path.join(tmp, "class", sid))
                shutil.copy(variant_source(self.spec, variant, tmp),
                            os.path.join(tmp, "class", sid, main))
                entries.append((sid, os.path.join(tmp, "class", sid)))
            opts = GradeOptions(seeds=[1, 2], out=os.path.join(tmp, "out"))
            results = {r.submission_id: r for r in grade_batch(self.spec, entries, opts, jobs=1,
                                                                progress=report)}
        self.assertEqual(results["solution"].score, self.spec.max_score,
                         "\n".join(f"{t.name}: {t.status}\n{t.output}"
                                   for t in results["solution"].tests if t.status != "passed"))
        failed = {t.name for t in results["starter"].failed}
        self.assertEqual(failed, {t.name for t in self.spec.per_seed_tests})


class StyleTest(unittest.TestCase):
    def test_lab_drivers_pass_checkpatch_strict(self):
        """Starters, solutions and lab headers of every lab: kernel style, as
        checkpatch.pl --strict -f sees it (students start from clean code)."""
        checkpatch = os.path.join(kernel.SRC, "scripts", "checkpatch.pl")
        self.assertTrue(os.path.exists(checkpatch), "run make kernel first")
        files = []
        for lab in lab_names():
            d = os.path.join(LABS_DIR, lab)
            files += glob.glob(os.path.join(d, "starter", "*.c"))
            files += glob.glob(os.path.join(d, "solutions", "*", "*.c"))
            files += glob.glob(os.path.join(d, "*.h"))
        self.assertGreaterEqual(len(files), 9)
        for path in files:
            with self.subTest(file=os.path.relpath(path, LABS_DIR)):
                res = subprocess.run(["perl", checkpatch, "--strict", "--no-tree", "-f", path],
                                     cwd=kernel.SRC, capture_output=True, text=True,
                                     env={**os.environ, "PATH": "/usr/bin:/bin"}, timeout=120)
                self.assertRegex(res.stdout, r"total: 0 errors, 0 warnings, 0 checks",
                                 res.stdout)


class PostingLabTest(LabClaims, unittest.TestCase):
    LAB = "posting"


class ModernLabTest(LabClaims, unittest.TestCase):
    LAB = "modern"


if __name__ == "__main__":
    unittest.main()
