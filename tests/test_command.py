"""python3 -m mmiolab: one command over the kit's entry points, and the one base
of the kit's exceptions it catches."""

import inspect
import os
import subprocess
import sys
import tempfile
import unittest

from mmiolab import BUILD, ROOT, MmiolabError

PY = "/usr/bin/python3"
ENV = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "scripts")}


def command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "mmiolab", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=120)


class CommandTest(unittest.TestCase):
    def test_lists_its_subcommands(self):
        res = command("--help")
        self.assertEqual(res.returncode, 0)
        for name in ("grade", "labvm", "kernel", "vm", "run", "timeline", "handout",
                     "gradescope", "prairielearn", "labstats", "demo", "merge"):
            self.assertRegex(res.stdout, rf"(?m)^  {name} ")
        res = command()
        self.assertEqual((res.returncode, res.stdout), (2, ""))
        self.assertIn("usage: python3 -m mmiolab SUBCOMMAND", res.stderr)

    def test_an_unknown_subcommand(self):
        res = command("grades")
        self.assertEqual(res.returncode, 2)
        self.assertIn("mmiolab: no subcommand 'grades'", res.stderr)

    def test_each_subcommand_is_its_script(self):
        for args, script in ((["grade", "--help"], ["grade", "--help"]),
                             (["labvm", "--help"], ["kit", "labvm", "--help"]),
                             (["gradescope", "--help"], ["gradescope", "--help"]),
                             (["grade", "--lab", "nope"], ["grade", "--lab", "nope"])):
            with self.subTest(args):
                got = command(*args)
                want = subprocess.run([PY, os.path.join(ROOT, "scripts", script[0]), *script[1:]],
                                      cwd=ROOT, capture_output=True, text=True, timeout=120)
                self.assertEqual((got.returncode, got.stdout, got.stderr),
                                 (want.returncode, want.stdout, want.stderr))

    def test_a_kit_error_no_entry_point_explains_is_one_line(self):
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            book = os.path.join(tmp, "gradebook.csv")
            os.mkdir(book)                              # a folder where the gradebook goes
            res = command("merge", "-o", book, tmp)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertRegex(res.stderr, r"^mmiolab: merge: error: .*unreadable gradebook.*\n$")
        self.assertNotIn("Traceback", res.stderr)

    def test_the_makefiles_call_it(self):
        res = subprocess.run(["make", "-n", "-C", os.path.join(ROOT, "labs", "doorbell"),
                              "timeline"], capture_output=True, text=True, timeout=60)
        self.assertIn("-m mmiolab timeline --lab doorbell", res.stdout)


class ErrorsTest(unittest.TestCase):
    def test_every_error_of_the_kit_is_a_mmiolab_error(self):
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import importlib
        folder = os.path.join(ROOT, "scripts", "mmiolab")
        found = []
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".py") or name.startswith("__"):
                continue
            mod = importlib.import_module(f"mmiolab.{name[:-3]}")
            for cname, cls in inspect.getmembers(mod, inspect.isclass):
                if cls.__module__ == mod.__name__ and issubclass(cls, BaseException) \
                        and not cname.startswith("_"):
                    found.append(cname)
                    self.assertTrue(issubclass(cls, MmiolabError), f"{name}: {cname}")
        self.assertGreaterEqual(len(found), 17)


if __name__ == "__main__":
    unittest.main()
