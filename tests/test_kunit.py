"""The fabric's KUnit suite, booted in QEMU; its KTAP is checked by the kernel's own parser."""

import os
import re
import subprocess
import unittest

from mmiolab import vm
from vmtest import KUNIT_KO, KUNIT_PY, log_dir, need_guest, report

KTAP_LINE = re.compile(r"^\[\s*[\d.]+\]\s?(.*)$")


def ktap_from_dmesg(console: str, suite: str) -> str:
    """The suite's KTAP from dmesg, under the top-level header a module load omits."""
    lines = [m.group(1) if (m := KTAP_LINE.match(line)) else line
             for line in console.splitlines()]
    start = lines.index(f"    # Subtest: {suite}") - 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("ok ")
               or lines[i].startswith("not ok "))
    return "KTAP version 1\n1..1\n" + "\n".join(lines[start:end + 1]) + "\n"


class KUnitTest(unittest.TestCase):
    def setUp(self):
        need_guest(self)
        if not os.path.exists(KUNIT_KO):
            self.fail(f"{KUNIT_KO} missing: run 'make kernel'")

    def test_mmiosim_suite(self):
        cmd = "insmod /lib/modules/mmiosim_kunit.ko && dmesg"
        res = vm.run(cmd, files={"/lib/modules/mmiosim_kunit.ko": KUNIT_KO},
                     cfg=vm.VMConfig(timeout=120), log_dir=log_dir("kunit"))
        self.assertTrue(res.ok, res.describe())
        ktap = ktap_from_dmesg(res.console, "mmiosim")
        path = os.path.join(log_dir("kunit"), "results.ktap")
        with open(path, "w") as f:
            f.write(ktap)
        parsed = subprocess.run(["/usr/bin/python3", KUNIT_PY, "parse", path],
                                capture_output=True, text=True, cwd=os.path.dirname(KUNIT_PY))
        out = parsed.stdout + parsed.stderr
        self.assertEqual(parsed.returncode, 0, out)
        m = re.search(r"Testing complete\. Ran (\d+) tests: passed: (\d+)", out)
        self.assertIsNotNone(m, out)
        self.assertEqual(m.group(1), m.group(2), out)
        self.assertGreaterEqual(int(m.group(1)), 11)
        report(f"KUnit: {m.group(0)}; guest run {res.seconds:.1f}s")


if __name__ == "__main__":
    unittest.main()
