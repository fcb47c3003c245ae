"""KTAP parsing and the harness trust filter, against recorded guest logs
(tests/data/ktap, see its README) and against the kernel's own parser.

The kernel's tools/testing/kunit/kunit.py must accept what our harness
prints; the 6.1 tree under build/ is used read-only (no byte-code written).
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from mmiolab import ktap
from kitcfg import TREE

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "ktap")
NONCE = "5f0c1a9e3b7d42c8a6e1f90b2d4c7e38"
NAMES = ["load_unload", "single_cpu", "race", "cost"]
S = ktap.Status
KERNEL = os.environ.get("MMIOLAB_KERNEL_SRC", TREE.src)
KUNIT = os.path.join(KERNEL, "tools", "testing", "kunit", "kunit.py")


def data(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


def statuses(result):
    return {k: v.status for k, v in result.expect(NAMES).items()}


class RecordedRunsTest(unittest.TestCase):
    def test_pass(self):
        r = ktap.parse(data("pass.channel.log"), NONCE)
        self.assertEqual(r.status, S.PASS)
        self.assertEqual(r.version, "KTAP version 1")
        self.assertEqual(statuses(r), dict.fromkeys(NAMES, S.PASS))
        self.assertEqual(r.untrusted_lines, 0)
        self.assertEqual(r.errors, [])
        race = r.expect(["race"])["race"]
        self.assertEqual([t.name for t in race.subtests], ["seed_1", "seed_2", "seed_3"])
        self.assertEqual(race.subtests[1].values()["lost"], "0")
        self.assertEqual(r.root.find("cost").values()["flush"], "mmiowb")

    def test_race_failure(self):
        r = ktap.parse(data("race-fail.channel.log"), NONCE)
        self.assertEqual(r.status, S.FAIL)
        self.assertEqual(statuses(r), {"load_unload": S.PASS, "single_cpu": S.PASS,
                                       "race": S.FAIL, "cost": S.SKIP})
        race = r.root.find("race")
        self.assertTrue(all(t.status is S.FAIL for t in race.subtests))
        v = race.subtests[0].values()
        self.assertEqual((v["lost"], v["duplicated"], v["stale_doorbells"]), ("6", "3", "4"))
        self.assertIn("first stale doorbell", "\n".join(race.subtests[0].diagnostics()))
        cost = r.root.find("cost")
        self.assertEqual(cost.directive, "SKIP")
        self.assertIn("race test failed", cost.reason)

    def test_crash_mid_test(self):
        r = ktap.parse(data("crash.channel.log"), NONCE)
        self.assertEqual(r.status, S.CRASHED)
        self.assertEqual(statuses(r), {"load_unload": S.PASS, "single_cpu": S.PASS,
                                       "race": S.CRASHED, "cost": S.CRASHED})
        race = r.root.find("race")
        self.assertEqual([t.status for t in race.subtests], [S.PASS, S.CRASHED, S.CRASHED])
        self.assertTrue(any("never reported" in e for e in r.errors))
        self.assertIn("before this test reported", r.expect(["cost"])["cost"].errors[0])

    def test_fake_ktap_from_the_module_changes_nothing(self):
        r = ktap.parse(data("fake.console.log"), NONCE)
        self.assertEqual(statuses(r), {"load_unload": S.PASS, "single_cpu": S.PASS,
                                       "race": S.FAIL, "cost": S.SKIP})
        self.assertEqual(r.status, S.FAIL)
        # the module's plain KTAP, the wrong nonce and nonce-as-prefix lines are all untrusted
        self.assertGreaterEqual(r.untrusted_lines, 10)
        joined = "\n".join(r.untrusted_sample)
        self.assertIn("deadbeef", joined)
        self.assertIn(NONCE + "x", joined)
        self.assertIn(NONCE + "0 ok 3 race", joined)
        self.assertEqual(len(r.root.find("race").subtests), 1)

    def test_module_ktap_alone_is_a_crash_not_a_pass(self):
        text = "\n".join(l for l in data("fake.console.log").splitlines() if NONCE not in l)
        self.assertIn("ok 3 race", text)
        r = ktap.parse(text, NONCE)
        self.assertEqual(r.status, S.CRASHED)
        self.assertEqual(r.trusted_lines, 0)
        self.assertEqual(set(statuses(r).values()), {S.CRASHED})
        self.assertIn("no trusted output", r.expect(["race"])["race"].errors[0])

    def test_no_output_at_all(self):
        for text in ("", "\n\n", []):
            r = ktap.parse(text, NONCE)
            self.assertEqual(r.status, S.CRASHED)
            self.assertEqual(set(statuses(r).values()), {S.CRASHED})
        self.assertEqual(ktap.parse("").status, S.CRASHED)

    def test_kunit_tap14_flavour(self):
        r = ktap.parse(data("kunit-tap14.log"))
        self.assertEqual(r.version, "TAP version 14")
        fabric, card = r.root.subtests
        self.assertEqual((fabric.name, fabric.status), ("mmiosim_fabric", S.FAIL))
        self.assertEqual((card.name, card.status), ("mmiosim_card", S.PASS))
        self.assertEqual(card.subtests[1].status, S.SKIP)
        self.assertEqual(fabric.subtests[2].diagnostics(),
                         ["mmiowb_orders_not_arrival: EXPECTATION FAILED at "
                          "drivers/misc/mmiosim/test.c:88"])
        self.assertEqual(r.status, S.FAIL)


class ParserTest(unittest.TestCase):
    def wrap(self, body):
        return "\n".join(f"{NONCE} {l}" if l else NONCE
                         for l in textwrap.dedent(body).strip("\n").splitlines())

    def test_missing_planned_tests_are_crashed(self):
        r = ktap.parse(self.wrap("""
            KTAP version 1
            1..4
            ok 1 load_unload
            """), NONCE)
        self.assertEqual(r.status, S.CRASHED)
        self.assertEqual([t.status for t in r.root.subtests],
                         [S.PASS, S.CRASHED, S.CRASHED, S.CRASHED])
        self.assertEqual(statuses(r)["single_cpu"], S.CRASHED)

    def test_version_only_or_plan_only(self):
        self.assertEqual(ktap.parse(self.wrap("KTAP version 1\n1..4"), NONCE).status, S.CRASHED)
        r = ktap.parse(self.wrap("# harness starting"), NONCE)
        self.assertEqual(r.status, S.CRASHED)
        self.assertIn("no KTAP version line", r.errors[0])

    def test_timestamps_crlf_and_caller_ids(self):
        lines = [f"[   12.345678] {NONCE} KTAP version 1\r",
                 f"[   12.345679][    T1] {NONCE} 1..1\r",
                 f"[12.3] {NONCE} ok 1 load_unload\r"]
        r = ktap.parse("\n".join(lines), NONCE)
        self.assertEqual(r.status, S.PASS)
        self.assertEqual(ktap.strip_timestamp("[    0.060000] \t# Subtest: x"), "\t# Subtest: x")

    def test_nonce_must_be_the_first_word(self):
        text = "\n".join([f"{NONCE} KTAP version 1", f"{NONCE} 1..1",
                          f"x{NONCE} ok 1 load_unload", f"{NONCE}ok 1 load_unload",
                          f" {NONCE[:-1]} ok 1 load_unload"])
        r = ktap.parse(text, NONCE)
        self.assertEqual(r.untrusted_lines, 3)
        self.assertEqual(r.status, S.CRASHED)

    def test_bad_nonce_is_refused(self):
        for bad in ("", "short", "has space in it", "x" * 200):
            with self.assertRaises(ktap.KtapError):
                ktap.parse("anything", bad)
        n = ktap.make_nonce()
        self.assertEqual(len(n), 32)
        self.assertNotEqual(n, ktap.make_nonce())

    def test_directives(self):
        r = ktap.parse(self.wrap("""
            KTAP version 1
            1..7
            ok 1 a # SKIP no second CPU
            not ok 2 b # TIMEOUT 30 seconds
            ok 3 c # TIMEOUT said ok but timed out
            not ok 4 d # ERROR could not open /dev/ring0
            not ok 5 e # TODO not yet
            ok 6 f # rcode=0
            ok 7 - g
            """), NONCE)
        got = {t.name: (t.status, t.directive) for t in r.root.subtests}
        self.assertEqual(got, {"a": (S.SKIP, "SKIP"), "b": (S.FAIL, "TIMEOUT"),
                               "c": (S.FAIL, "TIMEOUT"), "d": (S.ERROR, "ERROR"),
                               "e": (S.FAIL, "TODO"), "f": (S.PASS, ""), "g": (S.PASS, "")})
        self.assertEqual(r.root.find("f").values(), {"rcode": "0"})
        self.assertEqual(r.root.find("a").reason, "no second CPU")

    def test_parent_ok_over_a_failed_subtest_fails(self):
        r = ktap.parse(self.wrap("""
            KTAP version 1
            1..1
              KTAP version 1
              # Subtest: race
              1..2
              ok 1 seed_1
              not ok 2 seed_2
            ok 1 race
            """), NONCE)
        race = r.root.find("race")
        self.assertEqual(race.status, S.FAIL)
        self.assertTrue(race.errors)

    def test_ktap_rst_example(self):
        """The example of Documentation/dev-tools/ktap.rst parses as the text describes."""
        r = ktap.parse(textwrap.dedent("""\
            KTAP version 1
            1..1
              KTAP version 1
              1..3
                KTAP version 1
                1..1
                # test_1: initializing test_1
                ok 1 test_1
              ok 1 example_test_1
                KTAP version 1
                1..2
                ok 1 test_1 # SKIP test_1 skipped
                ok 2 test_2
              ok 2 example_test_2
                KTAP version 1
                1..3
                ok 1 test_1
                # test_2: FAIL
                not ok 2 test_2
                ok 3 test_3 # SKIP test_3 skipped
              not ok 3 example_test_3
            not ok 1 main_test
            """))
        main = r.root.subtests[0]
        self.assertEqual((main.name, main.status), ("main_test", S.FAIL))
        e1, e2, e3 = main.subtests
        self.assertEqual([(t.name, t.status) for t in main.subtests],
                         [("example_test_1", S.PASS), ("example_test_2", S.PASS),
                          ("example_test_3", S.FAIL)])
        self.assertEqual(e1.subtests[0].diagnostics(), ["test_1: initializing test_1"])
        self.assertEqual([t.status for t in e2.subtests], [S.SKIP, S.PASS])
        self.assertEqual([t.status for t in e3.subtests], [S.PASS, S.FAIL, S.SKIP])
        self.assertEqual(e3.subtests[2].reason, "test_3 skipped")
        self.assertEqual(r.errors, [])
        self.assertEqual(len(main.leaves()), 6)

    def test_noise_inside_nested_tests(self):
        r = ktap.parse(textwrap.dedent("""\
            KTAP version 1
            1..1
              KTAP version 1
              # Subtest: race
              1..2
            random kernel noise, unindented
              ok 1 seed_1
            ringdrv: irq 5 storm
              ok 2 seed_2
            ok 1 race
            """))
        self.assertEqual(r.root.find("race").status, S.PASS)
        self.assertIn("ringdrv: irq 5 storm", r.root.find("seed_2").log)

    def test_result_beyond_plan_and_wrong_number(self):
        r = ktap.parse(self.wrap("""
            KTAP version 1
            1..1
            ok 1 load_unload
            ok 3 single_cpu
            """), NONCE)
        self.assertTrue(any("beyond the plan" in e for e in r.errors))
        self.assertTrue(any("expected test number 2" in e for e in r.errors))

    def test_duplicate_results_keep_the_worst(self):
        r = ktap.parse(self.wrap("""
            KTAP version 1
            1..2
            not ok 1 race
            ok 2 race
            """), NONCE)
        hit = r.expect(["race"])["race"]
        self.assertEqual(hit.status, S.FAIL)
        self.assertTrue(any("2 times" in e for e in hit.errors))

    def test_deep_nesting_does_not_recurse_forever(self):
        text = "KTAP version 1\n1..1\n" + "KTAP version 1\n" * 5000 + "ok 1 x\n"
        r = ktap.parse(text)            # untrusted self-check input: must not blow the stack
        self.assertTrue(any("nested deeper" in e for e in r.errors))
        self.assertNotEqual(r.status, S.PASS)

    def test_only_newline_ends_a_line(self):
        text = (f"{NONCE} KTAP version 1\n{NONCE} 1..1\n"
                f"{NONCE} # load_unload: x\x1c{NONCE} ok 1 load_unload\n")
        r = ktap.parse(text, NONCE)
        self.assertEqual(r.status, S.CRASHED)      # the smuggled result is not a line

    def test_worst(self):
        self.assertEqual(ktap.worst([S.PASS, S.SKIP]), S.SKIP)
        self.assertEqual(ktap.worst([S.FAIL, S.CRASHED, S.ERROR]), S.CRASHED)
        self.assertEqual(ktap.worst([]), S.CRASHED)


class ConsoleTest(unittest.TestCase):
    def test_crash_console(self):
        text = data("crash.console.log")
        kinds = [e.kind for e in ktap.scan_console(text)]
        self.assertEqual(kinds[0], "bug")
        self.assertIn("oops", kinds)
        self.assertIn("panic", kinds)
        ex = ktap.console_excerpt(text)
        self.assertIn("RIP: 0010:ringdrv_complete", ex)
        self.assertIn("ringdrv_irq", ex)
        self.assertTrue(ex.startswith("[console lines"))

    def test_clean_console(self):
        text = data("pass.console.log")
        self.assertEqual(ktap.scan_console(text), [])
        self.assertIn("exit status 0", ktap.console_excerpt(text))

    def test_warning_lockdep_hung(self):
        text = "\n".join([
            "[    5.1] ------------[ cut here ]------------",
            "[    5.1] WARNING: CPU: 1 PID: 80 at drivers/misc/ringdrv.c:120 ring_submit+0x4/0x9",
            "[    6.0] WARNING: possible circular locking dependency detected",
            "[    7.0] INFO: task harness:81 blocked for more than 10 seconds.",
            "[    8.0] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [harness:81]",
            "[    9.0] BUG: sleeping function called from invalid context at mm/slab.h:12"])
        kinds = [e.kind for e in ktap.scan_console(text)]
        self.assertEqual(kinds, ["warning", "warning", "lockdep", "hung", "softlockup", "bug"])

    def test_excerpt_is_capped(self):
        text = "\n".join(["x" * 500] * 200 + ["Kernel panic - not syncing: boom"] + ["y" * 500] * 200)
        ex = ktap.console_excerpt(text, max_chars=2000)
        self.assertLess(len(ex), 2200)
        self.assertIn("[... cut]", ex)


@unittest.skipUnless(os.path.isfile(KUNIT), f"no kernel tree with kunit.py at {KERNEL}")
class KernelParserTest(unittest.TestCase):
    """What our harness prints must satisfy the kernel's own KTAP parser."""

    def kunit_parse(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(text)
        try:
            env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
            return subprocess.run([sys.executable, "-B", KUNIT, "parse", "--json=stdout", f.name],
                                  capture_output=True, text=True, timeout=60, env=env,
                                  cwd=KERNEL)
        finally:
            os.unlink(f.name)

    def strip_nonce(self, text):
        return "\n".join(l[len(NONCE) + 1:] if l.startswith(NONCE + " ") else l
                         for l in text.splitlines()) + "\n"

    def cases(self, out):
        """{test case name: kunit status} from kunit.py's --json output (names may repeat
        across groups; ours do not)."""
        doc = json.loads(out[out.index("{"):])
        found = {}

        def walk(group, prefix):
            for c in group["test_cases"]:
                found[prefix + c["name"]] = c["status"]
            for g in group["sub_groups"]:
                walk(g, prefix + g["name"] + ".")
        walk(doc, "")
        return found

    def test_harness_output_parses_without_errors(self):
        want_fail = {"load_unload": "PASS", "single_cpu": "PASS", "race.seed_1": "FAIL",
                     "race.seed_2": "FAIL", "race.seed_3": "FAIL", "cost": "SKIP"}
        for name, rc, cases in [("pass.channel.log", 0, dict.fromkeys(want_fail, "PASS")),
                                ("race-fail.channel.log", 1, want_fail)]:
            with self.subTest(name):
                p = self.kunit_parse(self.strip_nonce(data(name)))
                self.assertNotIn("[ERROR]", p.stdout + p.stderr)
                self.assertEqual(p.returncode, rc, p.stdout + p.stderr)
                self.assertIn("Testing complete.", p.stdout)
                self.assertEqual(self.cases(p.stdout), cases)

    def test_same_verdicts_as_kunit(self):
        """Our root status and kunit.py's exit code agree on our samples and kunit's own."""
        logs = [self.strip_nonce(data(n)) for n in ("pass.channel.log", "race-fail.channel.log",
                                                   "crash.channel.log")]
        logs.append(data("kunit-tap14.log"))
        kunit_data = os.path.join(os.path.dirname(KUNIT), "test_data")
        for n in ("test_is_test_passed-all_passed_nested.log", "test_kernel_panic_interrupt.log",
                  "test_is_test_passed-failure.log", "test_skip_tests.log",
                  "test_interrupted_tap_output.log", "test_pound_sign.log"):
            with open(os.path.join(kunit_data, n), errors="backslashreplace") as f:
                logs.append(f.read())
        for i, text in enumerate(logs):
            with self.subTest(i):
                ours = ktap.parse(text).status
                p = self.kunit_parse(text)
                self.assertEqual(ours is S.PASS, p.returncode == 0, p.stdout[-800:])

    def test_no_bytecode_written_into_the_tree(self):
        self.kunit_parse("KTAP version 1\n1..1\nok 1 x\n")
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(KUNIT), "__pycache__")))


if __name__ == "__main__":
    unittest.main()
