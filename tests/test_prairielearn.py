"""The PrairieLearn external grader: results.json from a graded submission (score
as a fraction, gradable only as the grader decides, hidden tests held back,
sizes capped), the question folder and grader image a lab packs to (no
answers, no hidden tests in the public image), and one real submission graded
through the packed entrypoint and scripts/grade --prairielearn."""

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

from mmiolab import ROOT, labspec, model, stages
from mmiolab.platforms import PLATFORMS, prairielearn
from mmiolab.platforms.gradescope.pack import read_member
from mmiolab.platforms.prairielearn import pack as pl_pack
from kitcfg import BUILD, CFG
from vmtest import need_guest, report as say

MARKER = "HIDDEN-MARKER-7f3a9c"


def outcome(name, score, most, status="passed", output="", visibility="visible",
            html=""):
    return model.TestOutcome(name, score, most, status, output, visibility,
                              f"what {name} checks", html=html)


def result(tests, verdict="graded", notes=()):
    return model.GradeResult(submission_id="submission", lab="doorbell", tests=tests,
                              verdict=verdict, notes=list(notes), submission="student",
                              console_log="console.log", host="grader")


def sample(**kw):
    """A lab's shape: visible tests partly passed, two hidden tests whose every
    word is the marker."""
    return result([
        outcome("build", 10, 10, output="gcc: no warnings"),
        outcome("race", 0, 30, "failed", "race: 6 commands lost"),
        outcome("cost", 5, 10, output="flush=readback fraction=0.5"),
        outcome(f"race_4cpu_{MARKER}", 5, 5, output=f"{MARKER} four CPUs passed",
                visibility="after_published"),
        outcome("race_long", 0, 5, "crashed", f"guest said {MARKER}: oops",
                visibility="hidden"),
    ], **kw)


class ResultsJsonTest(unittest.TestCase):
    def test_score_is_the_fraction_of_the_points(self):
        doc = prairielearn.results_json(sample())
        self.assertTrue(doc["gradable"])
        self.assertAlmostEqual(doc["score"], 20 / 60)
        self.assertEqual(sum(t["points"] for t in doc["tests"]), 20)
        self.assertEqual(sum(t["max_points"] for t in doc["tests"]), 60)
        full = result([outcome("build", 10, 10), outcome("race", 30, 30)])
        self.assertEqual(prairielearn.results_json(full)["score"], 1.0)

    def test_no_points_is_score_zero(self):
        doc = prairielearn.results_json(result([outcome("build", 0, 0)]))
        self.assertEqual(doc["score"], 0.0)
        self.assertTrue(doc["gradable"])

    def test_only_a_grader_failure_is_not_gradable(self):
        spec = labspec.load_lab("doorbell")
        broken = stages.not_graded(spec, "s", "build-failed", "ringdrv.c:3: error: oops")
        doc = prairielearn.results_json(broken)
        self.assertTrue(doc["gradable"])
        self.assertEqual(doc["score"], 0.0)
        self.assertIn("build-failed", doc["message"])
        self.assertIn("ringdrv.c:3: error: oops", doc["output"])
        failed = stages.not_graded(spec, "s", "grader-error", "internal grader error")
        doc = prairielearn.results_json(failed)
        self.assertIs(doc["gradable"], False)
        self.assertIn("not counted", doc["message"])
        slow = stages.not_graded(spec, "s", model.TOO_SLOW, stages.TOO_SLOW_WORDS)
        doc = prairielearn.results_json(slow)
        self.assertIs(doc["gradable"], False)
        self.assertIn("too slow", doc["message"])
        self.assertIn("not counted", doc["message"])

    def test_hidden_tests_never_show_what_they_printed(self):
        for verdict in ("graded", "grader-error"):
            doc = prairielearn.results_json(sample(verdict=verdict))
            text = json.dumps(doc)
            self.assertNotIn(MARKER, text)
            self.assertNotIn("race_long", text)
            held = [t for t in doc["tests"] if t["name"].startswith(prairielearn.HIDDEN_NAME)]
            self.assertEqual(len(held), 1)
            self.assertEqual((held[0]["points"], held[0]["max_points"]), (5, 10))
            self.assertEqual(held[0]["message"], prairielearn.HIDDEN_MESSAGE)
            self.assertEqual(held[0]["output"], "")
        # The summary says where the held-back points are, in PrairieLearn's terms.
        self.assertNotIn("when grades are published", doc["output"])
        self.assertIn(prairielearn.HIDDEN_NAME, doc["output"])

    def test_sizes_are_capped(self):
        big = "x" * (2 << 20)
        svg = "<svg xmlns='http://www.w3.org/2000/svg'>" + "<g/>" * 50000 + "</svg>"
        res = result([outcome(f"t{i}", 0, 1, "failed", big, html=svg) for i in range(40)]
                     + [outcome("h", 0, 1, "failed", big, visibility="hidden")])
        doc = prairielearn.results_json(res)
        size = len(json.dumps(doc).encode())
        self.assertLess(size, prairielearn.MAX_RESULTS_BYTES)
        for t in doc["tests"]:
            self.assertLessEqual(len(t["output"]), prairielearn.MAX_TEST_OUTPUT + 100)
        self.assertLessEqual(len(doc["output"]), prairielearn.MAX_OUTPUT + 100)
        say(f"40 failing tests of 2 MiB output each: results.json {size >> 10} KiB")

    def test_a_small_picture_is_an_image(self):
        svg = "<svg xmlns='http://www.w3.org/2000/svg'><rect width='1' height='1'/></svg>"
        doc = prairielearn.results_json(result([
            outcome("race", 0, 30, "failed", "lost", html=f"<p>caption</p>{svg}\n"),
            outcome("cost", 0, 10, "failed", "no picture", html="<p>no svg</p>")]))
        (image,) = doc["tests"][0]["images"]
        prefix = "data:image/svg+xml;base64,"
        self.assertTrue(image["url"].startswith(prefix))
        self.assertEqual(base64.b64decode(image["url"][len(prefix):]).decode(), svg)
        self.assertEqual(doc["tests"][1]["images"], [])

    def test_shape(self):
        """The fields docs/externalGrading.md documents, with their types."""
        doc = prairielearn.results_json(sample())
        self.assertEqual(set(doc), {"gradable", "score", "message", "output", "tests"})
        self.assertIsInstance(doc["gradable"], bool)
        self.assertIsInstance(doc["score"], float)
        self.assertTrue(0 <= doc["score"] <= 1)
        for key in ("message", "output"):
            self.assertIsInstance(doc[key], str)
        for t in doc["tests"]:
            self.assertLessEqual({"name", "points", "max_points", "message", "output"}, set(t))
            self.assertLessEqual(set(t), {"name", "description", "points", "max_points",
                                          "message", "output", "images"})
            self.assertIsInstance(t["points"], (int, float))
            self.assertTrue(0 <= t["points"] <= t["max_points"])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "results", "results.json")
            prairielearn.write_results(sample(), path)
            with open(path, encoding="utf-8") as f:
                self.assertEqual(json.load(f), doc)


class PackTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="prairielearn-")
        cls.spec = labspec.load_lab("doorbell")
        cls.out = pl_pack.pack(cls.spec, cls.tmp, image="course/mmiolab-doorbell:1", cfg=CFG)
        cls.files = sorted(os.path.relpath(os.path.join(d, n), cls.out)
                           for d, _, names in os.walk(cls.out) for n in names)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def read(self, rel):
        with open(os.path.join(self.out, rel), encoding="utf-8") as f:
            return f.read()

    def test_no_answers_anywhere(self):
        for rel in self.files:
            with self.subTest(rel):
                self.assertFalse({"solutions", "fixtures", "correct"} & set(rel.split(os.sep)))
                self.assertNotIn(os.path.basename(rel), ("labstats", "handout", "demo",
                                                        "labtest.py"))
        lines = set()
        for sol in self.spec.solutions:
            with open(self.spec.solution_source(sol, CFG)) as f:
                lines |= {line.strip() for line in f if len(line.strip()) > 8}
        with open(os.path.join(self.spec.dir, "starter", "ringdrv.c")) as f:
            lines -= {line.strip() for line in f}
        self.assertTrue(lines)
        for rel in self.files:
            if rel.startswith(("question", "grader-image/kit/labs")):
                text = self.read(rel)
                self.assertEqual([a for a in lines if a in text], [], rel)

    def test_hidden_tests_are_in_the_question_not_the_public_image(self):
        hidden = [r for r in self.files if "hidden" in r.split(os.sep)]
        self.assertEqual(hidden, ["question/tests/hidden/harness.sh",
                                  "question/tests/hidden/hidden.toml"])
        self.assertTrue(os.access(os.path.join(self.out, hidden[0]), os.X_OK))

    def test_info_json(self):
        info = json.loads(self.read("question/info.json"))
        self.assertLessEqual({"uuid", "type", "title", "topic"}, set(info))
        self.assertRegex(info["uuid"], r"^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$")
        self.assertEqual(info["uuid"], pl_pack.question_uuid("doorbell"))
        self.assertNotEqual(info["uuid"], pl_pack.question_uuid("posting"))
        self.assertEqual((info["type"], info["gradingMethod"]), ("v3", "External"))
        ext = info["externalGradingOptions"]
        self.assertEqual(ext["image"], "course/mmiolab-doorbell:1")
        self.assertTrue(ext["enabled"])
        self.assertFalse(ext["enableNetworking"])
        self.assertLessEqual(ext["timeout"], 600)
        self.assertEqual(ext["entrypoint"], pl_pack.ENTRYPOINT)
        other = pl_pack.pack(self.spec, os.path.join(self.tmp, "again"), cfg=CFG)
        with open(os.path.join(other, "question", "info.json")) as f:
            again = json.load(f)
        self.assertEqual(again["uuid"], info["uuid"])
        self.assertTrue(again["externalGradingOptions"]["image"].startswith("example.invalid/"))

    def test_question_and_image(self):
        html = self.read("question/question.html")
        self.assertIn('file-name="ringdrv.c"', html)
        self.assertIn("<pl-external-grader-results>", html)
        with open(os.path.join(self.spec.dir, "starter", "ringdrv.c")) as f:
            self.assertEqual(self.read("question/clientFilesQuestion/ringdrv.c"), f.read())
        docker = self.read("grader-image/Dockerfile")
        self.assertIn("FROM ubuntu:24.04", docker)
        self.assertRegex(docker, r"(?m)^RUN /mmiolab/scripts/deps grade")
        self.assertIn(f'ENTRYPOINT ["{pl_pack.ENTRYPOINT}"]', docker)
        entry = os.path.join(self.out, "grader-image", "entrypoint.sh")
        self.assertEqual(os.stat(entry).st_mode & 0o777, 0o755)
        res = subprocess.run(["shellcheck", entry], capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, res.stdout)
        self.assertIn("--lab doorbell --prairielearn ||", self.read("grader-image/entrypoint.sh"))
        for need in ("scripts/grade", "scripts/mmiolab/platforms/prairielearn/__init__.py", "Makefile",
                     "labs/doorbell/lab.toml", "labs/doorbell/tests/harness.sh"):
            self.assertIn(f"grader-image/kit/{need}", self.files)
        # The kernel and initramfs come built; the module build's source link is kept.
        for need in ("kernel/obj/arch/x86/boot/bzImage", "kernel/obj/Module.symvers",
                     "kernel/obj/.config", "initramfs/base.cpio.gz"):
            self.assertIn(f"grader-image/kit/prebuilt/{need}", self.files)
        link = os.path.join(self.out, "grader-image/kit/prebuilt/kernel/obj/source")
        self.assertEqual(os.readlink(link), "../src")
        res = subprocess.run(["make", "-n", "prairielearn", "LAB=doorbell", "IMAGE=a/b"],
                             cwd=ROOT, capture_output=True, text=True)
        self.assertIn("-m mmiolab prairielearn --lab doorbell --image 'a/b'", res.stdout)

    def test_no_hidden_tests_is_not_gradable(self):
        """A question copied without tests/ does not grade out of fewer points."""
        grade = os.path.join(self.tmp, "grade-no-tests")
        os.makedirs(os.path.join(grade, "student"))
        env = {**os.environ, "MMIOLAB_PRAIRIELEARN": grade,
               "MMIOLAB_KIT": os.path.join(self.tmp, "no-kit")}
        res = subprocess.run([os.path.join(self.out, "grader-image", "entrypoint.sh")],
                             env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("tests/hidden", res.stderr)
        with open(os.path.join(grade, "results", "results.json")) as f:
            doc = json.load(f)
        self.assertIs(doc["gradable"], False)


class ReadMemberTest(unittest.TestCase):
    """The graders' packs read a kit file through gradescope.read_member: a link
    stays inside the kit and out of the answers; lab.toml as students get it."""

    def test_links_and_lab_toml(self):
        from mmiolab.handout import HandoutError
        root = tempfile.mkdtemp(prefix="read-member-", dir=BUILD)
        self.addCleanup(shutil.rmtree, root)
        lab = os.path.join(root, "labs", "doorbell")
        os.makedirs(os.path.join(lab, "solutions"))
        for name in ("ok.c", "solutions/fix.c"):
            with open(os.path.join(lab, name), "w") as f:
                f.write(name)
        os.symlink("ok.c", os.path.join(lab, "inside.c"))
        os.symlink("solutions/fix.c", os.path.join(lab, "answer.c"))
        os.symlink("/etc/hostname", os.path.join(lab, "outside.c"))
        shutil.copy(os.path.join(ROOT, "labs", "doorbell", "lab.toml"), lab)
        data, src = read_member(root, "labs/doorbell/inside.c", "a grader")
        self.assertEqual((data, src), (b"ok.c", os.path.realpath(os.path.join(lab, "ok.c"))))
        self.assertIsNone(read_member(root, "labs/doorbell/none.c", "a grader"))
        for name in ("answer.c", "outside.c"):
            with self.assertRaisesRegex(HandoutError, "which a grader cannot carry"):
                read_member(root, f"labs/doorbell/{name}", "a grader")
        toml, _ = read_member(root, "labs/doorbell/lab.toml", "a grader")
        with open(os.path.join(lab, "lab.toml"), "rb") as f:
            self.assertNotEqual(toml, f.read())    # the student's lab.toml


class EndToEndTest(unittest.TestCase):
    def test_the_starter_graded_through_the_entrypoint(self):
        """The doorbell starter, graded as PrairieLearn would run the packed image:
        /grade laid out, the packed entrypoint, the packed kit's scripts/grade
        --prairielearn, with the kernel and initramfs it carries."""
        need_guest(self)
        tmp = tempfile.mkdtemp(prefix="prairielearn-", dir=BUILD)
        try:
            spec = labspec.load_lab("doorbell")
            out = pl_pack.pack(spec, os.path.join(tmp, "out"), cfg=CFG)
            grade = os.path.join(tmp, "grade")
            os.makedirs(os.path.join(grade, "student"))
            shutil.copy(os.path.join(spec.dir, "starter", "ringdrv.c"),
                        os.path.join(grade, "student"))
            shutil.copytree(os.path.join(out, "question", "tests"), os.path.join(grade, "tests"))
            kit = os.path.join(out, "grader-image", "kit")
            os.chmod(tmp, 0o755)          # as in the image: the build's user enters the kit
            # The packed kit's own prebuilt kernel and initramfs, not this kit's build/.
            env = {k: v for k, v in os.environ.items() if k != "MMIOLAB_BUILD"}
            env.update(MMIOLAB_PRAIRIELEARN=grade, MMIOLAB_KIT=kit,
                       MMIOLAB_KERNEL_TARBALL=os.path.join(tmp, "no-kernel-source.tar.xz"))
            t0 = time.monotonic()
            res = subprocess.run([os.path.join(out, "grader-image", "entrypoint.sh")],
                                 env=env, capture_output=True, text=True, timeout=900,
                                 stdin=subprocess.DEVNULL)
            seconds = time.monotonic() - t0
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            with open(os.path.join(grade, "results", "results.json"), encoding="utf-8") as f:
                text = f.read()
            doc = json.loads(text)
            self.assertIs(doc["gradable"], True, text[:3000])
            self.assertLess(doc["score"], 1.0)
            tests = {t["name"]: t for t in doc["tests"]}
            self.assertEqual(set(tests), {"build", "load_unload", "single_cpu", "race", "cost",
                                          "clean_log", f"{prairielearn.HIDDEN_NAME} (3)"})
            self.assertEqual(tests["race"]["points"], 0)
            self.assertEqual(len(tests["race"].get("images", [])), 1, "the failing run's picture")
            self.assertEqual(tests[f"{prairielearn.HIDDEN_NAME} (3)"]["max_points"], 30)
            for word in ("race_4cpu", "race_long", "race_every_run", ROOT, BUILD, grade):
                self.assertNotIn(word, text)
            self.assertFalse(re.search(r"/mmiolab/|prairielearn-run", text))
            say(f"entrypoint: {seconds:.1f}s (doorbell starter, score {doc['score']:.2f})")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
