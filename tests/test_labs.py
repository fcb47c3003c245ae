"""Every lab's claims, measured: the starter fails, each reference solution and
each correct variant (labs/LAB/correct/) passes in every run, each wrong-fix
fixture (labs/LAB/fixtures/) fails "at least 95 runs in 100" (at this count:
fixture_floor), and the grader scores both ends of a lab as its lab.toml says.
Counts, not timings.

make check runs SEEDS seeds per wrong fix and GOOD_SEEDS per starter,
solution and correct variant (many variants share one guest:
labtest.run_variants); scripts/labstats runs 100 and prints the table. The
doorbell lab's extra fabrics (pc, 5.2) are in tests/test_doorbell.py.
"""

import glob
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from mmiolab.grade import GradeOptions, grade_batch
from mmiolab.lab import RACE_CMDS
from mmiolab.labspec import LABS_DIR, apply_patch, lab_names, load_lab
from mmiolab.labtest import patches, run_variants, variant_source, variants
from kitcfg import BUILD, CFG, TREE
from vmtest import fixture_floor, need_guest, report

SEEDS = list(range(1, int(os.environ.get("MMIOLAB_LAB_SEEDS", "10")) + 1))
# Seeds for the starter, the solutions and the correct variants: "every run
# of a correct variant passes" is exact at any count, where a wrong fix's "at
# least 95 in 100" needs SEEDS runs to allow one pass (fixture_floor; the
# starter, 100/100 in labstats, is held to it too). labstats runs 100.
GOOD_SEEDS = SEEDS[:int(os.environ.get("MMIOLAB_LAB_GOOD_SEEDS", "5"))]
# Commands per CPU in a race run. Wrong fixes run the grader's (lab.RACE_CMDS;
# a run stops at its first failure); correct ones run fewer here, to keep make
# check short: scripts/labstats measures them at the grader's count.
GOOD_CMDS = int(os.environ.get("MMIOLAB_LAB_CMDS", "3000"))
# Sessions per seed in the posting lab's teardown run, for the same reason:
# the grader's harness runs 750 (labs/posting/tests/harness.sh).
GOOD_CYCLES = int(os.environ.get("MMIOLAB_LAB_CYCLES", "300"))
# Keys the labs' test programs print that describe a run, not what went wrong
# in it: they need no words in a lab's [phrases].
RUN_FACTS = {"seed", "cpus", "cpu", "irq_cpu", "cycles", "wait_us", "settle_us", "commands",
             "completed", "seconds", "first_failure_at", "reads_per_cmd", "mmiowbs_per_cmd",
             "throughput_cps", "flush", "doorbells", "bursts", "by_mmiowb", "by_read",
             "unordered", "idle_flushes", "ordering_ns", "ns_per_doorbell"}


class LabClaims:
    """Mixed into one TestCase per lab; LAB names the lab."""
    LAB = ""
    #: More harness environment for the starter, solutions and correct
    #: variants (the posting lab's run length is its harness's CYCLES).
    GOOD_ENV = None

    @classmethod
    def setUpClass(cls):
        cls.spec = load_lab(cls.LAB)

    def tally_all(self, names, cmds=RACE_CMDS, env=None, only=None, seeds=SEEDS):
        """Each variant's Tallies from one guest (run_variants); `only`: the
        one per-seed test of each to report (the others were not run)."""
        tallies = run_variants(self.spec, names, seeds, cmds=cmds, env=env, cfg=CFG)
        for v in names:
            for t in tallies[v].values():
                if only and t.test != only:
                    continue
                first = f", median first failure at {t.median_first_failure}" \
                    if t.first_failure else ""
                report(f"{self.LAB} {v} {t.test}: failed {t.failed}/{t.runs}{first}, "
                       f"{t.seconds:.0f}s (batch)")
        return tallies

    # -- files, no guest
    def test_lab_files(self):
        self.assertTrue(self.spec.per_seed_tests)
        self.assertGreaterEqual(len(patches(self.spec, "fixture")), 10)
        self.assertGreaterEqual(len(patches(self.spec, "correct")), 3)
        with tempfile.TemporaryDirectory() as tmp:
            for v in variants(self.spec):
                if not v.startswith(("fixture:", "correct:")):
                    continue
                kind, name = v.split(":")
                with self.subTest(variant=v):
                    work = os.path.join(tmp, name)
                    os.makedirs(work)
                    src = variant_source(self.spec, v, work, CFG)    # patch -F0 must apply
                    with open(self.spec.fixture_base_source(CFG)) as a, open(src) as b:
                        self.assertNotEqual(a.read(), b.read())
                    folder = "fixtures" if kind == "fixture" else "correct"
                    with open(os.path.join(self.spec.dir, folder, name + ".patch")) as f:
                        first = f.readline()
                    self.assertTrue(first.startswith(("Wrong fix" if kind == "fixture"
                                                      else "Correct") + f" ({name}): "),
                                    "a one-line why first")
        for harness in (os.path.join(self.spec.dir, "tests", "harness.sh"),
                        self.spec.hidden_harness):
            self.assertTrue(shutil.which("shellcheck"), "shellcheck missing: run make deps")
            # -x: it follows the harness library (vm/harness-lib.sh) it sources.
            res = subprocess.run(["shellcheck", "-x", "-s", "sh", harness], capture_output=True,
                                 text=True)
            self.assertEqual(res.returncode, 0, res.stdout)
        self.assertTrue(self.spec.hidden_tests, "every lab has hidden tests")

    def test_solutions_apply_to_the_starter(self):
        """Every solutions/NAME.patch applies to the starter as it is now
        (patch -F0: no fuzz) and says first what it is."""
        self.assertTrue(self.spec.solutions)
        with tempfile.TemporaryDirectory() as tmp:
            for name in self.spec.solutions:
                with self.subTest(solution=name):
                    with open(self.spec.solution_patch(name)) as f:
                        self.assertTrue(f.readline().startswith(f"Solution ({name}): "),
                                        "a one-line why first")
                    dest = os.path.join(tmp, name, self.spec.files[0])
                    os.makedirs(os.path.dirname(dest))
                    apply_patch(self.spec.starter, self.spec.solution_patch(name), dest)
                    with open(dest) as a, open(self.spec.solution_source(name, CFG)) as b:
                        self.assertEqual(a.read(), b.read())

    def test_lab_toml_rows_and_phrases(self):
        """lab.toml's [[labstats]] rows name variants the lab has, and its
        [phrases] only keys the lab's test programs print (key=value)."""
        have = variants(self.spec)
        self.assertTrue(self.spec.labstats)
        for row in self.spec.labstats:
            self.assertIn(row.variant, have)
        programs = ""
        for pattern in ("tests/*", "hidden/*"):
            for path in sorted(glob.glob(os.path.join(self.spec.dir, pattern))):
                with open(path, encoding="utf-8") as f:
                    programs += f.read()
        self.assertTrue(self.spec.phrases)
        for key in self.spec.phrases:
            self.assertRegex(programs, rf"\b{key}=%", key)
        # ...and every key they print has words, unless it describes the run
        # (RUN_FACTS): a failed test's "why" line names what went wrong.
        printed = set(re.findall(r"\b([a-z][a-z0-9_]*)=%", "\n".join(
            line for line in programs.splitlines() if "scanf(" not in line)))  # (read, not printed)
        self.assertGreater(len(printed), len(self.spec.phrases))
        self.assertEqual(printed - RUN_FACTS - set(self.spec.phrases), set(),
                         "keys with no [phrases] words (or add a run fact to RUN_FACTS)")

    # -- in the guest
    def test_starter_fails_solutions_and_correct_variants_pass(self):
        need_guest(self)
        good = [v for v in variants(self.spec) if v.startswith(("solution:", "correct:"))]
        tallies = self.tally_all(["starter"] + good, cmds=GOOD_CMDS, env=self.GOOD_ENV,
                                 seeds=GOOD_SEEDS)
        for t in tallies["starter"].values():
            self.assertGreaterEqual(t.failed, fixture_floor(t.runs),
                                    f"{t.test}: the starter must fail essentially every run")
        for v in good:
            for t in tallies[v].values():
                with self.subTest(variant=v, test=t.test):
                    self.assertEqual(t.failed, 0, f"{v} {t.test}\n{t.why()}")

    def broken_test(self, fixture):
        """The per-seed test a wrong fix breaks, if only that one is raced
        (broken_env), or None: every test runs and the worst one counts."""
        return None

    def broken_env(self, test):
        """The harness environment that races only `test` (broken_test)."""
        return None

    def test_wrong_fixes_fail(self):
        need_guest(self)
        bad = [v for v in variants(self.spec) if v.startswith("fixture:")]
        groups = {}
        for v in bad:
            groups.setdefault(self.broken_test(v), []).append(v)
        tallies = {}
        for test, names in sorted(groups.items(), key=lambda g: g[0] or ""):
            tallies.update(self.tally_all(names, env=self.broken_env(test), only=test))
        for v in bad:
            with self.subTest(fixture=v):
                test = self.broken_test(v)
                worst = (tallies[v][test].failed if test
                         else max(t.failed for t in tallies[v].values()))
                self.assertGreaterEqual(worst, fixture_floor(len(SEEDS)),
                                        f"{v}: {len(SEEDS) - worst} of {len(SEEDS)} runs passed")

    def test_grader_scores_starter_and_solution(self):
        need_guest(self)
        main = self.spec.files[0]
        solution = next(v for v in variants(self.spec) if v.startswith("solution:"))
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            entries = []
            for sid, variant in (("starter", "starter"), ("solution", solution)):
                os.makedirs(os.path.join(tmp, "class", sid))
                shutil.copy(variant_source(self.spec, variant, tmp, CFG),
                            os.path.join(tmp, "class", sid, main))
                entries.append((sid, os.path.join(tmp, "class", sid)))
            opts = GradeOptions(seeds=[1, 2], out=os.path.join(tmp, "out"), cfg=CFG)
            results = {r.submission_id: r for r in grade_batch(self.spec, entries, opts, jobs=1,
                                                                progress=report)}
        self.assertEqual(results["solution"].score, self.spec.max_score,
                         "\n".join(f"{t.name}: {t.status}\n{t.output}"
                                   for t in results["solution"].tests if t.status != "passed"))
        failed = {t.name for t in results["starter"].failed}
        self.assertTrue({t.name for t in self.spec.per_seed_tests if t.source == "ktap"} <= failed,
                        failed)


class StyleTest(unittest.TestCase):
    def test_lab_drivers_pass_checkpatch_strict(self):
        """Starters, solutions and lab headers of every lab: kernel style, as
        checkpatch.pl --strict -f sees it (students start from clean code)."""
        checkpatch = os.path.join(TREE.src, "scripts", "checkpatch.pl")
        self.assertTrue(os.path.exists(checkpatch), "run make kernel first")
        files = []
        for lab in lab_names():
            d = os.path.join(LABS_DIR, lab)
            files += glob.glob(os.path.join(d, "starter", "*.c"))
            spec = load_lab(lab)
            files += [spec.solution_source(n, CFG) for n in spec.solutions]
            files += glob.glob(os.path.join(d, "*.h"))
        self.assertGreaterEqual(len(files), 9)
        for path in files:
            with self.subTest(file=os.path.relpath(path, LABS_DIR)):
                res = subprocess.run(["perl", checkpatch, "--strict", "--no-tree", "-f", path],
                                     cwd=TREE.src, capture_output=True, text=True,
                                     env={**os.environ, "PATH": "/usr/bin:/bin"}, timeout=120)
                self.assertRegex(res.stdout, r"total: 0 errors, 0 warnings, 0 checks",
                                 res.stdout)


class LabstatsBudgetTest(unittest.TestCase):
    """labstats --budget: a row's guest stopped at its budget counts the seeds
    that reported, marked partial (the guest and the build faked)."""

    def run_variant(self, **kw):
        from types import SimpleNamespace
        from unittest import mock
        from mmiolab import labtest, lab, vm
        data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "ktap")
        with open(os.path.join(data, "pass.channel.log")) as f:
            channel = "".join(f.readlines()[:14])          # seeds 1 and 2 of 3 reported
        result = vm.RunResult("hang", None, "", channel, 10.0, 1.0, "tcg", "console.log")
        calls = []

        def run_guest(spec, ko, seeds, log_dir, **opts):
            calls.append(opts["timeout"])
            return lab.Run(seeds, "5f0c1a9e3b7d42c8a6e1f90b2d4c7e38", result)
        with mock.patch.object(labtest, "build_driver", return_value=SimpleNamespace(ko="x.ko")), \
                mock.patch.object(labtest.stages, "run_guest", run_guest):
            tally = labtest.run_variant(load_lab("doorbell"), "starter", [1, 2, 3], cfg=CFG,
                                         **kw)["race"]
        return tally, calls[0]

    def test_a_stopped_row_counts_what_reported(self):
        t, timeout = self.run_variant(stop_after=10)
        self.assertEqual(timeout, 10)
        self.assertEqual((t.runs, t.failed, t.of, t.partial), (2, 0, 3, True))
        self.assertEqual(t.partial_note(), "  partial: 2 of 3 seeds, stopped at the budget")

    def test_without_a_budget_a_hang_fails_every_seed(self):
        t, timeout = self.run_variant()
        self.assertEqual(timeout, 60)              # doorbell's run_timeout, 3 seeds
        self.assertEqual((t.runs, t.failed, t.partial, t.partial_note()), (3, 3, False, ""))
        t, timeout = self.run_variant(stop_after=600)     # past the time limit: no budget
        self.assertEqual((timeout, t.failed, t.partial), (60, 3, False))


class DoorbellLabTest(LabClaims, unittest.TestCase):
    LAB = "doorbell"


class PostingLabTest(LabClaims, unittest.TestCase):
    LAB = "posting"
    GOOD_ENV = {"CYCLES": str(GOOD_CYCLES)}


class ModernLabTest(LabClaims, unittest.TestCase):
    LAB = "modern"

    # A modern fixture's name says the submit path it breaks (mutex-wmb: the
    # mutex path) and the others are the fixture base's, correct: the suite
    # races that path alone (the harness's RACE_ONLY), a third of the runs,
    # and asserts it fails. scripts/labstats still races every path of every
    # fixture (the table's rows show the others pass).
    def broken_test(self, fixture):
        path = fixture.split(":", 1)[1].split("-", 1)[0]
        self.assertIn(path, [t.name for t in self.spec.per_seed_tests], fixture)
        return path

    def broken_env(self, test):
        return {"RACE_ONLY": test}


if __name__ == "__main__":
    unittest.main()
