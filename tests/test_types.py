"""mypy --strict over the kit's host tooling (scripts/mypy.ini: the modules not
yet clean are listed there, and the list only shrinks)."""

import os
import shutil
import subprocess
import unittest

from mmiolab import ROOT

SCRIPTS = os.path.join(ROOT, "scripts")


class TypesTest(unittest.TestCase):
    def test_mypy_strict(self):
        mypy = shutil.which("mypy")
        if mypy is None:
            self.fail("mypy is not installed (Debian package mypy): run 'make deps'")
        res = subprocess.run([mypy, "--config-file", "mypy.ini", "--no-incremental",
                              "-p", "mmiolab"], cwd=SCRIPTS, capture_output=True, text=True,
                             timeout=600)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_the_excused_modules_exist(self):
        """A module renamed or gone leaves the list instead of excusing nothing."""
        with open(os.path.join(SCRIPTS, "mypy.ini")) as f:
            sections = [line.strip()[1:-1] for line in f if line.startswith("[mypy-")]
        for section in sections:
            for name in section.removeprefix("mypy-").split(","):
                path = os.path.join(SCRIPTS, *name.split("."))
                with self.subTest(name):
                    self.assertTrue(os.path.isfile(path + ".py")
                                    or os.path.isfile(os.path.join(path, "__init__.py")), name)


if __name__ == "__main__":
    unittest.main()
