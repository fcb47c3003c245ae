"""make kernel: a patch that does not apply stops the build and is named."""

import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

from mmiolab import ROOT, kernel
from kitcfg import BUILD, CFG, TREE


class PatchSeriesTest(unittest.TestCase):
    def test_bad_patch_is_named(self):
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            patches = os.path.join(tmp, "patches")
            shutil.copytree(CFG.patches, patches)
            bad = "9999-does-not-apply.patch"
            with open(os.path.join(patches, bad), "w") as f:
                f.write("--- a/Makefile\n+++ b/Makefile\n@@ -1,3 +1,3 @@\n"
                        " no such line\n-in the kernel\n+Makefile\n context\n")
            with open(os.path.join(patches, "series"), "a") as f:
                f.write(bad + "\n")
            env = {**os.environ, "MMIOLAB_PATCHES": patches,
                   "MMIOLAB_BUILD": os.path.join(tmp, "build")}
            res = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", "kit"),
                                  "kernel"], env=env, capture_output=True, text=True,
                                 timeout=300)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn(bad, res.stderr)
            self.assertIn("does not apply", res.stderr)
            n = len(kernel.series(CFG.patches))
            self.assertIn(f"patch {n + 1}/{n + 1}", res.stderr)

    def test_series_lists_every_patch(self):
        listed = set(kernel.series(CFG.patches))
        on_disk = {f for f in os.listdir(CFG.patches)
                   if f.endswith(".patch") and not f.startswith("0000-")}
        self.assertEqual(listed, on_disk)

    def test_cover_letter_is_written_and_current(self):
        """The cover letter has its own subject and text (not git format-patch's
        placeholders) and its shortlog names the series' patches in order."""
        with open(os.path.join(CFG.patches, "0000-cover-letter.patch"), encoding="utf-8") as f:
            cover = f.read()
        self.assertNotIn("*** SUBJECT HERE ***", cover)
        self.assertNotIn("*** BLURB HERE ***", cover)
        n = len(kernel.series(CFG.patches))
        self.assertRegex(cover, rf"Subject: \[PATCH 00/{n}\] \w")
        subjects = []
        for name in kernel.series(CFG.patches):
            with open(os.path.join(CFG.patches, name), encoding="utf-8") as f:
                head = f.read().split("\n\n", 1)[0]
            subject = head.split("Subject: ", 1)[1]
            subject = re.sub(r"^\[PATCH \d+/\d+\] ", "", " ".join(subject.split()))
            subjects.append(subject)
        shortlog = cover.split(f"({n}):\n", 1)[1].split("\n\n", 1)[0]
        self.assertEqual(" ".join(shortlog.split()), " ".join(subjects))

    def test_bisect_compiles_what_each_patch_changes(self):
        """make bisect checks that each prefix compiled the .c files its last patch
        changes; the irq_sim patches come before MMIOSIM, so vm/bisect.config must
        turn on something in the tree that selects IRQ_SIM (gpio-sim)."""
        irq_sim = [n for n in kernel.series(CFG.patches)
                   if "kernel/irq/irq_sim.c" in kernel.changed_c_files(
                       os.path.join(CFG.patches, n))]
        self.assertGreaterEqual(len(irq_sim), 5)
        with open(kernel.BISECT_FRAGMENT) as f:
            self.assertIn("CONFIG_GPIO_SIM=y", f.read())
        with open(os.path.join(TREE.src, "drivers", "gpio", "Kconfig")) as f:
            kconfig = f.read()
        block = kconfig.split("config GPIO_SIM\n", 1)[1].split("\nconfig ", 1)[0]
        self.assertIn("select IRQ_SIM", block)

    def test_checkpatch_strict(self):
        """Every patch passes the kernel's own checkpatch.pl --strict: no error,
        no warning (the few CHECKs left are explained in the cover letter)."""
        checkpatch = os.path.join(TREE.src, "scripts", "checkpatch.pl")
        self.assertTrue(os.path.exists(checkpatch), "run make kernel first")
        env = {**os.environ, "PATH": "/usr/bin:/bin"}   # Debian's python3 for spdxcheck
        for name in kernel.series(CFG.patches):
            with self.subTest(patch=name):
                res = subprocess.run(["perl", checkpatch, "--strict",
                                      os.path.join(CFG.patches, name)],
                                     cwd=TREE.src, env=env, capture_output=True, text=True,
                                     timeout=120)
                self.assertRegex(res.stdout, r"total: 0 errors, 0 warnings,", res.stdout)

    def test_config_fragment_survives(self):
        config = os.path.join(TREE.obj, ".config")
        if not os.path.exists(config):
            self.fail("no kernel config: run 'make kernel'")
        kernel.check_config(config, kernel.FRAGMENT)


class ProgressTest(unittest.TestCase):
    """The build's progress line: the file count's estimate is another host's, so
    a count past it drops "of about M" (Debian 12 once showed 1043 of about 1018)."""

    def test_count_never_passes_its_estimate(self):
        import io
        import sys
        from unittest import mock
        from mmiolab import progress
        self.assertEqual(progress.compiled(5, 10), "5 of about 10 files compiled")
        self.assertEqual(progress.compiled(10, 10), "10 of about 10 files compiled")
        self.assertEqual(progress.compiled(11, 10), "11 files compiled")
        self.assertEqual(progress.compiled(3, 0), "3 files compiled")

        class Tty(io.StringIO):
            def isatty(self):
                return True
        # A fake build: five files, then time for the line to be drawn.
        fake = ["/bin/sh", "-c", "for i in 1 2 3 4 5; do echo '  CC x'; done; sleep 1.5"]
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            for about, want in ((3, "5 files compiled"), (9, "5 of about 9 files compiled")):
                with mock.patch.object(sys, "stdout", Tty()) as out:
                    progress.run_logged(fake, os.path.join(tmp, "log"), "build",
                                        count_prefix="  CC", count_about=about)
                self.assertIn(want, out.getvalue())
                self.assertNotIn("of about 3", out.getvalue())


class BuildLockTest(unittest.TestCase):
    """Two builds of one tree (a test's and `make kernel`'s) broke each other's
    dependency files: the second waits for the first, says so, then goes on."""

    def test_second_build_waits_for_the_first(self):
        import io
        import sys
        from unittest import mock
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            held, released = os.path.join(tmp, "held"), os.path.join(tmp, "released")
            child = subprocess.Popen([sys.executable, "-c", f"""
import os, sys, time
sys.path.insert(0, {os.path.join(ROOT, "scripts")!r})
from mmiolab import kernel
with kernel.building(kernel.Tree(kdir={tmp!r})):
    open({held!r}, "w").close()
    time.sleep(1)
    open({released!r}, "w").close()
"""])
            try:
                while not os.path.exists(held) and child.poll() is None:
                    time.sleep(0.05)
                with mock.patch.object(sys, "stdout", io.StringIO()) as out:
                    with kernel.building(kernel.Tree(kdir=tmp)):
                        self.assertTrue(os.path.exists(released))
            finally:
                self.assertEqual(child.wait(timeout=30), 0)
            self.assertIn("another process is building", out.getvalue())


if __name__ == "__main__":
    unittest.main()
