"""scripts/grade end to end: real submissions graded in the guest, hostile ones
explained, the batch never stopped, outputs in every format, resume."""

import csv
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import unittest
import xml.etree.ElementTree as ET

from mmiolab import BUILD, ROOT
from vmtest import need_guest, report

LAB = os.path.join(ROOT, "labs", "doorbell")
GRADE = os.path.join(ROOT, "scripts", "grade")
SCRATCH = os.path.join(BUILD, "scratch")


def starter() -> str:
    with open(os.path.join(LAB, "starter", "ringdrv.c")) as f:
        return f.read()


def mutate(old: str, new: str) -> str:
    s = starter()
    assert old in s, old
    return s.replace(old, new, 1)


PROBE_END = "\tdev_info(dev, \"ring of %d descriptors, irq %d\\n\", RING_ENTRIES, irq);\n"

# Each: student id -> (ringdrv.c text or None for special set-up, expected outcome)
CLASS = {
    "starter": (starter(), "race fails"),
    "mmiowb": (open(os.path.join(LAB, "solutions", "mmiowb", "ringdrv.c")).read(), "full marks"),
    "readback": (open(os.path.join(LAB, "solutions", "readback", "ringdrv.c")).read(), "cost partial"),
    "syntax-error": (mutate("static int ringdrv_probe", "static int ringdrv_probe oops"),
                     "build-failed"),
    "forbidden": (mutate(PROBE_END, PROBE_END + "\tmmiosim_flush();\n"), "forbidden-symbols"),
    "oops": (mutate(PROBE_END, PROBE_END + "\t*(volatile int *)NULL = 1;\n"), "panic"),
    "hang": (mutate(PROBE_END, PROBE_END + "\tfor (;;)\n\t\tcpu_relax();\n"), "hang"),
    "flood": (mutate(PROBE_END, PROBE_END + "\tfor (;;)\n\t\tpr_emerg(\"flood flood flood\\n\");\n"),
              "flood"),
    "fake-ktap": (mutate(PROBE_END, PROBE_END +
                         "\tpr_emerg(\"ok 3 race\\n\");\n\tpr_emerg(\"ok 4 cost\\n\");\n"),
                  "race fails"),
}


class GradeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="grade-", dir=os.path.join(ROOT, "build"))
        cls.klass = os.path.join(cls.tmp, "class")
        cls.out = os.path.join(cls.tmp, "out")
        os.makedirs(cls.klass)
        for sid, (text, _) in CLASS.items():
            os.makedirs(os.path.join(cls.klass, sid))
            with open(os.path.join(cls.klass, sid, "ringdrv.c"), "w") as f:
                f.write(text)
        # An archive that tries to escape: refused at intake, never built.
        evil = os.path.join(cls.klass, "traversal.tar.gz")
        with tarfile.open(evil, "w:gz") as t:
            src = os.path.join(cls.klass, "mmiowb", "ringdrv.c")
            t.add(src, arcname="../../escaped-ringdrv.c")
        os.makedirs(SCRATCH, exist_ok=True)    # the grader's own; made on first use
        cls.before = set(os.listdir(os.path.dirname(cls.tmp)))
        cls.scratch_before = set(os.listdir(SCRATCH))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        need_guest(self)

    def results(self, sid):
        with open(os.path.join(self.out, sid, "results.json")) as f:
            return json.load(f)

    def scores(self, sid):
        return {t["name"]: t["score"] for t in self.results(sid)["tests"]}

    def test_class_batch(self):
        res = subprocess.run(["/usr/bin/python3", GRADE, "--lab", "doorbell", "-j2", "--seeds", "3",
                              "--out", self.out, self.klass], capture_output=True, text=True,
                             timeout=900)
        report("\n     ".join(line for line in res.stdout.splitlines()))
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        for sid in list(CLASS) + ["traversal"]:
            for name in ("results.json", "junit.xml", "summary.txt"):
                self.assertTrue(os.path.exists(os.path.join(self.out, sid, name)), (sid, name))
            ET.parse(os.path.join(self.out, sid, "junit.xml"))
        s = self.scores("mmiowb")
        self.assertEqual(self.results("mmiowb")["score"], 100, s)
        r = self.scores("readback")
        self.assertEqual(r["race"], 40)
        self.assertLess(r["cost"], 10)
        st = self.scores("starter")
        self.assertEqual(st["race"], 0)
        self.assertEqual(st["single_cpu"], 20)
        self.assertEqual(self.scores("fake-ktap")["race"], 0, "printed KTAP must not count")
        for sid in ("syntax-error", "forbidden", "traversal"):
            self.assertEqual(self.results(sid)["score"], 0, sid)
        with open(os.path.join(self.out, "syntax-error", "summary.txt")) as f:
            self.assertIn("oops", f.read(), "the compiler's message is shown")
        with open(os.path.join(self.out, "forbidden", "summary.txt")) as f:
            self.assertIn("mmiosim_flush", f.read())
        for sid, word in (("oops", "panic"), ("hang", "hang"), ("flood", "flood")):
            data = self.results(sid)
            self.assertLess(data["score"], 50, sid)
            self.assertIn(word, json.dumps(data).lower(), sid)
        with open(os.path.join(self.out, "gradebook.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), len(CLASS) + 1)
        # Nothing escaped the scratch area.
        self.assertEqual(set(os.listdir(os.path.dirname(self.tmp))), self.before)
        self.assertEqual(set(os.listdir(SCRATCH)), self.scratch_before, "scratch left behind")
        self.assertFalse(os.path.exists(os.path.join(BUILD, "escaped-ringdrv.c")))

        # --resume regrades nothing already finished.
        again = subprocess.run(["/usr/bin/python3", GRADE, "--lab", "doorbell", "--resume",
                                "--out", self.out, self.klass], capture_output=True, text=True,
                               timeout=120)
        self.assertEqual(again.returncode, 0)
        self.assertEqual(again.stdout.count("already graded"), len(CLASS) + 1, again.stdout)


class GradescopeTest(unittest.TestCase):
    def setUp(self):
        need_guest(self)

    def test_autograder_layout(self):
        with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "build")) as root:
            os.makedirs(os.path.join(root, "submission"))
            shutil.copy(os.path.join(LAB, "solutions", "mmiowb", "ringdrv.c"),
                        os.path.join(root, "submission", "ringdrv.c"))
            res = subprocess.run(["/usr/bin/python3", GRADE, "--lab", "doorbell", "--gradescope"],
                                 env={**os.environ, "MMIOLAB_AUTOGRADER": root},
                                 capture_output=True, text=True, timeout=300)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            with open(os.path.join(root, "results", "results.json")) as f:
                data = json.load(f)
        self.assertEqual(data["score"], 100)
        self.assertEqual({t["name"] for t in data["tests"]},
                         {"build", "load_unload", "single_cpu", "race", "cost", "clean_log"})
        for t in data["tests"]:
            self.assertEqual(t["score"], t["max_score"], t)


if __name__ == "__main__":
    unittest.main()
