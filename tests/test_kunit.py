"""The fabric's KUnit suite, booted in QEMU; its KTAP is checked by the kernel's own parser."""

import os
import re
import subprocess
import unittest

from mmiolab import vm
from kitcfg import CFG, TREE
from vmtest import DEBUG_KERNEL, DEBUG_KUNIT_KO, KUNIT_KO, KUNIT_PY, log_dir, need_guest, report

KTAP_LINE = re.compile(r"^\[\s*[\d.]+\]\s?(.*)$")
# The warning card_refuses_ring_freed_with_another_size asks for (patch 11's
# ringdev_dma_free(): a dma_free_coherent() whose size is not the buffer's).
EXPECTED_WARNING = re.compile(r"WARNING: CPU: \d+ PID: \d+ at drivers/misc/mmiosim/ringdev\.c:\d+ "
                              r"ringdev_dma_free\b")


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

    def run_suite(self, kernel_image: str, ko: str, name: str):
        for path in (kernel_image, ko):
            if not os.path.exists(path):
                self.fail(f"{path} missing: run 'make kernel kernel-debug'")
        cmd = "insmod /lib/modules/mmiosim_kunit.ko && dmesg"
        res = vm.run(cmd, files={"/lib/modules/mmiosim_kunit.ko": ko},
                     cfg=vm.VMConfig.from_config(CFG, kernel=kernel_image, timeout=180), log_dir=log_dir(name))
        self.assertTrue(res.ok, res.describe())
        ktap = ktap_from_dmesg(res.console, "mmiosim")
        path = os.path.join(log_dir(name), "results.ktap")
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
        report(f"KUnit ({name}): {m.group(0)}; guest run {res.seconds:.1f}s")
        return res

    def test_mmiosim_suite(self):
        self.run_suite(TREE.bzimage, KUNIT_KO, "kunit")

    def test_mmiosim_suite_debug_kernel(self):
        """The same suite under lockdep, KFENCE, atomic-sleep and list checks: clean,
        but for the one warning a test asks for (a ring freed with the wrong size:
        the card warns once, from its DMA free)."""
        res = self.run_suite(DEBUG_KERNEL, DEBUG_KUNIT_KO, "kunit-debug")
        lines = res.console.splitlines()
        # Once (WARN_ONCE); the console shows it, and dmesg again.
        asked = {line.strip() for line in lines if EXPECTED_WARNING.search(line)}
        self.assertEqual(len(asked), 1, "the card's wrong-size free warning, once")
        splats = [line for line in lines
                  if re.search(r"WARNING:|BUG:|INFO: lockdep|possible .*locking|"
                               r"inconsistent lock state|KFENCE: |ODEBUG:|"
                               r"sleeping function called|list_(add|del) corruption", line)
                  and not EXPECTED_WARNING.search(line)]
        self.assertEqual(splats, [], "the debug kernel reported problems")

    def test_suite_skips_when_the_fabric_failed_to_start(self):
        """A boot parameter out of range stops the fabric's init; the exported
        calls (the suite's set-up uses several) then do nothing and the
        suite skips, instead of the kernel oopsing on queues never allocated."""
        if not os.path.exists(KUNIT_KO):
            self.fail(f"{KUNIT_KO} missing: run 'make kernel'")
        cmd = "insmod /lib/modules/mmiosim_kunit.ko; dmesg"
        res = vm.run(cmd, files={"/lib/modules/mmiosim_kunit.ko": KUNIT_KO},
                     cfg=vm.VMConfig.from_config(CFG, timeout=180, append=["mmiosim.jitter_ns=20000000"]),
                     log_dir=log_dir("kunit-no-fabric"))
        self.assertTrue(res.ok, res.describe())
        self.assertIn("timing parameters out of range", res.console)
        self.assertNotRegex(res.console, r"BUG:|Oops|general protection fault")
        ktap = ktap_from_dmesg(res.console, "mmiosim")
        results = re.findall(r"^ {4}(ok|not ok) \d+ (\S+)(.*)$", ktap, re.M)
        self.assertGreaterEqual(len(results), 11, ktap)
        not_skipped = [name for status, name, rest in results
                       if status != "ok" or "# SKIP" not in rest]
        self.assertEqual(not_skipped, [], ktap)
        report(f"KUnit without a fabric: {len(results)} tests skipped")


if __name__ == "__main__":
    unittest.main()
