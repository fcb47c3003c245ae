"""Grade outputs: Gradescope results.json, JUnit XML, the human summary and the
class gradebook (append, merge of shards, concurrent writers), built from the
recorded guest logs in tests/data/ktap."""

import csv
import dataclasses
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET
from unittest import mock

from mmiolab import ROOT, gradebook, ktap, labspec, model, report, stages
from mmiolab.platforms import gradescope, prairielearn

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "ktap")
NONCE = "5f0c1a9e3b7d42c8a6e1f90b2d4c7e38"
# The report's mechanics, on a fixed 100-point lab: the doorbell lab's visible
# tests, the race worth 40 (lab.toml gives it 10 and its hidden tests 30).
_FULL = labspec.load_lab("doorbell")
SPEC = dataclasses.replace(_FULL, tests=tuple(
    dataclasses.replace(t, points=40.0) if t.name == "race" else t
    for t in _FULL.tests if t.source not in ("hidden", "derived")))


def data(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


def host_tests(build="passed", clean="passed"):
    b = SPEC.test("build")
    c = SPEC.test("clean_log")
    return {
        "build": model.TestOutcome("build", b.points if build == "passed" else 0, b.points,
                                    build, "gcc: no warnings" if build == "passed" else
                                    "ringdrv.c:12:5: error: 'x' undeclared", b.visibility,
                                    b.description),
        "clean_log": model.TestOutcome("clean_log", c.points if clean == "passed" else 0,
                                        c.points, clean, "no kernel complaints",
                                        c.visibility, c.description),
    }


def graded(sample="race-fail.channel.log", student="alice", console="pass.console.log",
           graded_at=None, host="grader1", **kw):
    parsed = ktap.parse(data(sample), NONCE)
    res = model.GradeResult(
        submission_id=student, lab="doorbell",
        tests=stages.outcomes(SPEC, parsed, kw.pop("host_tests", host_tests())),
        replay=model.Replay(seeds=[1, 2, 3], profile="sn2", semantics="2004",
                             params={"route_ns": 400, "jitter_ns": 150},
                             first_failing_seed=1 if "fail" in sample else None,
                             seeds_passed=0 if "fail" in sample else 3),
        execution_time=11.4, console_log=f"/out/{student}/console.log",
        submission=f"class/{student}.tar.gz",
        console_excerpt=ktap.console_excerpt(data(console)), host=host, **kw)
    if graded_at:
        res.graded_at = graded_at
    return res


class OutcomesTest(unittest.TestCase):
    def test_scores_from_ktap(self):
        res = graded()
        got = {t.name: (t.score, t.status) for t in res.tests}
        self.assertEqual(got, {"build": (10, "passed"), "load_unload": (10, "passed"),
                               "single_cpu": (20, "passed"), "race": (0, "failed"),
                               "cost": (0, "skipped"), "clean_log": (10, "passed")})
        self.assertEqual((res.score, res.max_score), (50, 100))
        race = next(t for t in res.tests if t.name == "race")
        self.assertIn("6 commands lost", race.output)
        self.assertIn("4 stale doorbells", race.output)

    def test_pass_is_full_marks(self):
        res = graded("pass.channel.log")
        self.assertEqual(res.score, 100)
        self.assertEqual(res.failed, [])

    def test_crash_gives_crashed_tests_and_no_points(self):
        res = graded("crash.channel.log", console="crash.console.log",
                     host_tests=host_tests(clean="failed"))
        got = {t.name: t.status for t in res.tests}
        self.assertEqual(got["race"], "crashed")
        self.assertEqual(got["cost"], "crashed")
        self.assertEqual(res.score, 40)

    def cost(self, line):
        """The cost test scored with its harness line's measurements replaced."""
        text = data("pass.channel.log")
        text = re.sub(r"(# cost: ).*", lambda m: m.group(1) + line, text)
        parsed = ktap.parse(text, NONCE)
        return stages.outcome_from_ktap(SPEC.test("cost"), parsed.expect(["cost"])["cost"],
                                        SPEC.phrases)

    def test_cost_is_scored_by_the_labs_credit_table(self):
        """Issue 34: what each flush= earns is lab.toml's (credit_by, credit),
        not the score stage's; a harness's own fraction= counts for nothing."""
        readback = SPEC.test("cost").credit_for({"flush": "readback"})
        for line, score, why in (
                ("flush=mmiowb bursts=125 by_mmiowb=125", 10.0, None),
                ("flush=readback bursts=4000 by_read=4000 fraction=1", 5.0, readback.why),
                ("flush=none bursts=4000 unordered=4000 fraction=1", 0.0,
                 SPEC.test("cost").credit_for({"flush": "none"}).why),
                ("flush=fence bursts=1", 0.0, "flush=fence, which this lab gives no points"),
                ("bursts=1 fraction=1", 0.0, "flush=(nothing), which this lab gives no points")):
            with self.subTest(line):
                cost = self.cost(line)
                self.assertEqual((cost.score, cost.status), (score, "passed"))
                if why:
                    self.assertIn("why: ", cost.output)
                    self.assertIn(why, cost.output)
                else:
                    self.assertNotIn("why: ", cost.output)

    def test_missing_host_test_is_an_error(self):
        res = graded(host_tests={})
        self.assertEqual({t.name: t.status for t in res.tests}["build"], "error")

    def test_not_graded(self):
        res = stages.not_graded(SPEC, "mallory", "path-traversal",
                                "../ringdrv.c: '..' in the path would leave the folder",
                                submission="class/mallory.tgz")
        self.assertEqual(res.score, 0)
        self.assertEqual(res.max_score, 100)
        self.assertTrue(all(t.status == "error" for t in res.tests))
        self.assertIn("path-traversal", report.summary_text(res))

    def test_outcome_validation(self):
        with self.assertRaises(model.ReportError):
            model.TestOutcome("x", 11, 10, "passed")
        with self.assertRaises(model.ReportError):
            model.TestOutcome("x", 0, 10, "PASS")
        with self.assertRaises(model.ReportError):
            model.TestOutcome("x", 0, 10, "failed", visibility="secret")


class GradescopeTest(unittest.TestCase):
    def test_fields_follow_the_specification(self):
        doc = report.gradescope_json(graded())
        for key in ("score", "execution_time", "output", "visibility", "stdout_visibility",
                    "tests", "extra_data"):
            self.assertIn(key, doc)
        self.assertEqual(doc["score"], 50)
        self.assertIsInstance(doc["execution_time"], int)
        self.assertEqual(doc["visibility"], "visible")
        self.assertEqual(doc["stdout_visibility"], "hidden")
        self.assertEqual(len(doc["tests"]), 6)
        for t in doc["tests"]:
            self.assertEqual(set(t) - {"number", "extra_data"},
                             {"name", "score", "max_score", "status", "output", "visibility"})
            self.assertIn(t["status"], ("passed", "failed"))
        race = next(t for t in doc["tests"] if t["name"] == "race")
        self.assertEqual((race["score"], race["max_score"], race["status"]), (0, 40, "failed"))
        cost = next(t for t in doc["tests"] if t["name"] == "cost")
        self.assertEqual((cost["status"], cost["extra_data"]["status"]), ("failed", "skipped"))
        json.dumps(doc)

    def test_documents_meet_the_specification_checker(self):
        """The Gradescope platform's problems() reads a document as Gradescope's specification
        does; every document the grader writes passes it, and it catches what
        the specification does not allow."""
        for res in (graded(), stages.not_graded(SPEC, "bob", "build-failed", "no")):
            self.assertEqual(gradescope.problems(report.gradescope_json(res)), [])
        doc = report.gradescope_json(graded())
        doc["tests"][0]["status"] = "PASS"
        doc["tests"][1]["visibility"] = "secret"
        doc["tests"][2]["score"] = doc["tests"][2]["max_score"] + 1
        doc["max_score"] = 100
        bad = gradescope.problems(doc)
        self.assertEqual(len(bad), 5, bad)      # the four above and the sum they break
        self.assertIn("unknown field 'max_score'", bad)

    def test_replay_info_is_included(self):
        doc = report.gradescope_json(graded())
        self.assertIn("scripts/grade --lab doorbell --seed 1 class/alice.tar.gz", doc["output"])
        self.assertIn("profile sn2", doc["output"])
        self.assertIn("route_ns=400", doc["output"])
        extra = doc["extra_data"]["mmiolab"]
        self.assertEqual(extra["replay"]["seeds"], [1, 2, 3])
        self.assertEqual(extra["replay"]["first_failing_seed"], 1)
        self.assertEqual(extra["max_score"], 100)

    def test_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            res = graded()
            p = os.path.join(d, "results.json")
            report.write_results_json(res, p)
            back = report.load_results_json(p)
        self.assertEqual((back.submission_id, back.lab, back.score, back.max_score),
                         ("alice", "doorbell", 50, 100))
        self.assertEqual([t.status for t in back.tests], [t.status for t in res.tests])
        self.assertEqual(back.replay, res.replay)
        self.assertEqual(back.graded_at, res.graded_at)

    def test_which_confinement_ran(self):
        """The level that confined the build (bubblewrap, jail, unconfined) is in
        results.json, read back, in the summary and in the gradebook's row."""
        from mmiolab.gradebook import gradebook_row
        with tempfile.TemporaryDirectory() as d:
            res = graded(confinement="jail")
            p = os.path.join(d, "results.json")
            report.write_results_json(res, p)
            with open(p) as f:
                self.assertEqual(json.load(f)["extra_data"]["mmiolab"]["confinement"], "jail")
            self.assertEqual(report.load_results_json(p).confinement, "jail")
        self.assertIn("build confinement: jail\n", report.summary_text(res))
        self.assertEqual(gradebook_row(res)["confinement"], "jail")
        self.assertNotIn("build confinement", report.summary_text(graded()))

    def test_load_rejects_foreign_json(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "results.json")
            with open(p, "w") as f:
                json.dump({"score": 3, "tests": []}, f)
            with self.assertRaises(model.ReportError):
                report.load_results_json(p)

    def test_hostile_output_is_sanitized_and_capped(self):
        res = graded()
        res.tests[1].output = "a\x00b\x1b[31mred\udcff" + "z" * (100 << 10)
        doc = report.gradescope_json(res)
        out = doc["tests"][1]["output"]
        self.assertNotIn("\x00", out)
        self.assertIn("\\x1b", out)
        self.assertLess(len(out), 40 << 10)
        json.dumps(doc, ensure_ascii=False).encode("utf-8")


class JUnitTest(unittest.TestCase):
    def test_structure(self):
        res = graded("crash.channel.log", console="crash.console.log",
                     host_tests=host_tests(clean="failed"))
        root = ET.fromstring(report.junit_xml(res))
        suite = root.find("testsuite")
        self.assertEqual(suite.get("name"), "doorbell.alice")
        self.assertEqual(suite.get("tests"), "6")
        self.assertEqual(suite.get("errors"), "2")       # race, cost crashed
        self.assertEqual(suite.get("failures"), "1")     # clean_log
        cases = {c.get("name"): c for c in suite.findall("testcase")}
        self.assertEqual(list(cases), [t.name for t in SPEC.tests])
        self.assertIsNotNone(cases["race"].find("error"))
        self.assertIn("crashed", cases["race"].find("error").get("message"))
        self.assertIsNotNone(cases["clean_log"].find("failure"))
        self.assertIsNone(cases["build"].find("failure"))
        self.assertIsNotNone(cases["race"].find("system-out"))
        props = {p.get("name"): p.get("value") for p in suite.find("properties")}
        self.assertEqual(props["seeds"], "1,2,3")
        self.assertEqual(props["profile"], "sn2")
        self.assertEqual(props["fabric.route_ns"], "400")
        self.assertIn("--seed", props["replay"])
        self.assertIn("RIP: 0010:ringdrv_complete", suite.find("system-out").text)

    def test_skipped_and_partial(self):
        res = graded()
        res.tests[4] = model.TestOutcome("cost", 5, 10, "passed", "read-back fix: heavier")
        root = ET.fromstring(report.junit_xml(res))
        cases = {c.get("name"): c for c in root.iter("testcase")}
        self.assertIsNotNone(cases["cost"].find("failure"))      # 5/10 is not full marks
        res = graded()
        root = ET.fromstring(report.junit_xml(res))
        cases = {c.get("name"): c for c in root.iter("testcase")}
        self.assertIsNotNone(cases["cost"].find("skipped"))

    def test_control_characters_do_not_break_xml(self):
        res = graded(student="bob")
        res.tests[2].output = "ok\x00\x07\x1b[0m \udcff end"
        res.console_excerpt = "\x00panic\x08"
        root = ET.fromstring(report.junit_xml(res))
        self.assertIsNotNone(root)


class SummaryTest(unittest.TestCase):
    def test_what_failed_and_why(self):
        text = report.summary_text(graded())
        self.assertIn("alice: 50/100", text)
        self.assertIn("What failed and why:", text)
        self.assertIn("- race (0/40): the test ran and did not pass.", text)
        self.assertIn("6 commands lost", text)
        self.assertIn("skipped", text)
        self.assertIn("scripts/grade --lab doorbell --seed 1", text)
        self.assertIn("Console log: /out/alice/console.log", text)
        # The fabric in the kernel's words, as FABRIC= takes them (locking=2004).
        self.assertIn("fabric: profile sn2, locking 2004, jitter_ns=150, route_ns=400", text)

    def test_crash_summary_has_the_oops(self):
        text = report.summary_text(graded("crash.channel.log", console="crash.console.log"))
        self.assertIn("the guest crashed, hung or was stopped", text)
        self.assertIn("Oops: 0000", text)
        self.assertIn("Kernel panic - not syncing", text)

    def test_passing_summary_is_short(self):
        text = report.summary_text(graded("pass.channel.log"))
        self.assertNotIn("What failed", text)
        self.assertIn("100/100", text)


class InstructorOnlyTest(unittest.TestCase):
    """Flags, the diff and the hidden guest's time are the instructor's (issue 33):
    none of it in summary.txt, results.json (Gradescope's file too) or
    PrairieLearn's file; all of it in instructor.json and .txt, junit.xml and the
    gradebook, and read back with results.json."""

    FLAG = "kernel-memory walking? the new code uses user-copy helpers: _copy_from_user"

    def result(self):
        res = graded("pass.channel.log", flags=[self.FLAG], hidden_seconds=60.0,
                     diff="+\tringdrv_only_in_the_diff();")
        res.execution_time = 95.0
        return res

    def test_not_in_what_the_student_sees(self):
        res = self.result()
        with tempfile.TemporaryDirectory() as d:
            paths = report.write_all(res, d)
            pl = os.path.join(d, "pl.json")
            prairielearn.write_results(res, pl)
            for name in ("summary", "results"):
                with open(paths[name]) as f:
                    text = f.read()
                with self.subTest(name):
                    self.assertNotIn("_copy_from_user", text)
                    self.assertNotIn("flagged", text)
                    self.assertNotIn("ringdrv_only_in_the_diff", text)
                    self.assertNotIn("95", text)
            with open(pl) as f:
                self.assertNotIn("_copy_from_user", f.read())
            doc = json.load(open(paths["results"]))
            self.assertEqual(doc["execution_time"], 35)
            self.assertIn("in 35.0s (not counting the hidden tests)", doc["output"])
            self.assertNotIn("flags", doc["extra_data"]["mmiolab"])

    def test_in_the_instructors_files_and_read_back(self):
        res = self.result()
        with tempfile.TemporaryDirectory() as d:
            paths = report.write_all(res, d)
            for name in ("instructor_text", "junit"):
                with open(paths[name]) as f:
                    text = f.read()
                with self.subTest(name):
                    self.assertIn("flagged for the instructor: " + self.FLAG, text)
                    self.assertIn("in 95.0s (the hidden tests' guest 60.0s)", text)
            with open(paths["instructor_text"]) as f:
                self.assertIn("+\tringdrv_only_in_the_diff();", f.read())
            back = report.load_results_json(paths["results"])
            self.assertEqual((back.flags, back.diff, back.execution_time, back.hidden_seconds),
                             ([self.FLAG], "+\tringdrv_only_in_the_diff();", 95.0, 60.0))
            self.assertEqual(gradebook.gradebook_row(back)["flags"], self.FLAG)
            # A stale instructor.json (another grading) is not taken for this one's.
            res.graded_at = "2000-01-01T00:00:00+00:00"
            report.write_results_json(res, paths["results"])
            with self.assertRaises(model.ReportError):
                report.load_results_json(paths["results"])


class FilesTest(unittest.TestCase):
    def test_write_all(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "alice")
            paths = report.write_all(graded(), out)
            self.assertEqual(sorted(os.listdir(out)), ["instructor.json", "instructor.txt",
                                                       "junit.xml", "results.json",
                                                       "summary.txt"])
            for p in paths.values():
                self.assertGreater(os.path.getsize(p), 100)
                self.assertEqual(os.stat(p).st_mode & 0o777, 0o644)
            json.load(open(paths["results"]))
            ET.parse(paths["junit"])

    def test_undecodable_submission_path(self):
        with tempfile.TemporaryDirectory() as d:
            res = graded(student="fr_d")
            res.submission = "class/fr\udce9d.tar.gz"       # from a non-UTF-8 folder name
            paths = report.write_all(res, os.path.join(d, "fr_d"))
            doc = json.load(open(paths["results"], encoding="utf-8"))
            self.assertIn("fr\ufffdd", doc["extra_data"]["mmiolab"]["submission"])
            ET.parse(paths["junit"])
            gradebook.update_gradebook(os.path.join(d, "gb.csv"), [res])

    def test_atomic_write_keeps_the_old_file_on_failure(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "results.json")
            model.atomic_write(p, "old\n")
            with mock.patch("os.replace", side_effect=OSError("disk gone")):
                with self.assertRaises(OSError):
                    model.atomic_write(p, "new\n")
            self.assertEqual(open(p).read(), "old\n")
            self.assertEqual(os.listdir(d), ["results.json"])   # no temp file left


def _append_rows(args):
    path, worker = args
    for i in range(5):
        res = graded("pass.channel.log", student=f"w{worker}s{i}")
        gradebook.update_gradebook(path, [res])
    return worker


def _count_under_lock(args):
    """Adds 1 to the number in path, n times, each a read and a write under the
    gradebook's lock: a lost update means two holders at once."""
    path, n = args
    for _ in range(n):
        with gradebook._locked(path):
            with open(path) as f:
                value = int(f.read() or 0)
            time.sleep(0.0005)
            with open(path, "w") as f:
                f.write(str(value + 1))


class GradebookTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.book = os.path.join(self.d, "gradebook.csv")

    def tearDown(self):
        self.tmp.cleanup()

    def rows(self, path=None):
        with open(path or self.book, newline="") as f:
            return list(csv.DictReader(f))

    def test_one_row_per_student(self):
        gradebook.update_gradebook(self.book, [graded(student="alice"),
                                            graded("pass.channel.log", student="bob")])
        rows = self.rows()
        self.assertEqual([r["student"] for r in rows], ["alice", "bob"])
        a = rows[0]
        self.assertEqual((a["score"], a["max_score"], a["test:race"], a["test:build"]),
                         ("50", "100", "0", "10"))
        self.assertEqual(a["first_failing_seed"], "1")
        self.assertEqual(a["seeds"], "1 2 3")
        self.assertEqual(a["profile"], "sn2")
        self.assertIn("route_ns=400", a["params"])
        self.assertIn("race(failed)", a["failed_tests"])
        self.assertEqual(rows[1]["failed_tests"], "")

    def test_regrade_replaces_and_older_is_kept_out(self):
        gradebook.update_gradebook(self.book, [graded(student="alice",
                                                   graded_at="2025-01-02T10:00:00+00:00")])
        rep = gradebook.update_gradebook(self.book, [graded("pass.channel.log", student="alice",
                                                         graded_at="2025-01-03T10:00:00+00:00")])
        self.assertEqual((rep.replaced, rep.rows), (1, 1))
        self.assertEqual(self.rows()[0]["score"], "100")
        rep = gradebook.update_gradebook(self.book, [graded(student="alice",
                                                         graded_at="2025-01-01T10:00:00+00:00")])
        self.assertEqual(rep.kept, 1)
        self.assertEqual(self.rows()[0]["score"], "100")

    def test_formula_injection_is_neutralized(self):
        gradebook.update_gradebook(self.book, [graded(student="=HYPERLINK(\"x\")"),
                                            graded(student="@SUM(1)")])
        ids = sorted(r["student"] for r in self.rows())
        self.assertEqual(ids, ["'=HYPERLINK(\"x\")", "'@SUM(1)"])
        # and a re-grade still finds the same row
        rep = gradebook.update_gradebook(self.book, [graded(student="@SUM(1)")])
        self.assertEqual((rep.replaced, rep.rows), (1, 2))

    def test_concurrent_writers_lose_nothing(self):
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(4) as pool:
            pool.map(_append_rows, [(self.book, w) for w in range(4)])
        self.assertEqual(len(self.rows()), 20)
        self.assertEqual(os.listdir(self.d), ["gradebook.csv"])    # no lock file left

    def test_lock_file_is_removed_and_still_excludes(self):
        """The lock file goes on release; a writer that waited on the removed one
        must not count as holding the lock (mutual exclusion is kept)."""
        counter = os.path.join(self.d, "counter")
        open(counter, "w").close()
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(4) as pool:
            pool.map(_count_under_lock, [(counter, 100)] * 4)
        with open(counter) as f:
            self.assertEqual(f.read(), "400")
        self.assertFalse(os.path.exists(counter + ".lock"))
        gradebook.merge([], self.book)
        self.assertFalse(os.path.exists(self.book + ".lock"))

    def make_shard(self, name, students, host, when):
        shard = os.path.join(self.d, name)
        for s in students:
            res = graded("pass.channel.log" if s.endswith("ok") else "race-fail.channel.log",
                         student=s, host=host, graded_at=when)
            report.write_all(res, os.path.join(shard, s))
        return shard

    def test_merge_shards_from_several_hosts(self):
        a = self.make_shard("host-a", ["s1_ok", "s2", "s3_ok"], "host-a", "2025-05-01T10:00:00+00:00")
        b = self.make_shard("host-b", ["s4", "s5_ok", "s2"], "host-b", "2025-05-01T11:00:00+00:00")
        bad = os.path.join(b, "broken")
        os.makedirs(bad)
        with open(os.path.join(bad, "results.json"), "w") as f:
            f.write("{ half a file")
        extra = os.path.join(self.d, "shard-c.csv")
        gradebook.update_gradebook(extra, [graded(student="s6", host="host-c")])
        rep = gradebook.merge([a, b, extra], self.book)
        rows = {r["student"]: r for r in self.rows()}
        self.assertEqual(sorted(rows), ["s1_ok", "s2", "s3_ok", "s4", "s5_ok", "s6"])
        self.assertEqual(rows["s2"]["host"], "host-b")           # the newer grading wins
        self.assertEqual(rows["s6"]["host"], "host-c")
        self.assertTrue(rows["s1_ok"]["results"].endswith("results.json"))
        self.assertEqual(len(rep.problems), 1)
        self.assertIn("broken", rep.problems[0])
        again = gradebook.merge([a, b, extra], self.book)            # idempotent
        self.assertEqual(again.rows, 6)
        self.assertEqual(len(self.rows()), 6)

    def test_merge_entry_point(self):
        a = self.make_shard("host-a", ["s1_ok", "s2"], "host-a", "2025-05-01T10:00:00+00:00")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "scripts"))
        p = subprocess.run([sys.executable, "-m", "mmiolab", "merge", "-o", self.book, a],
                           capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("2 students", p.stdout)
        self.assertEqual(len(self.rows()), 2)


if __name__ == "__main__":
    unittest.main()
