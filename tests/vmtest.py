"""Helpers shared by the tests that boot the lab guest."""

import os
import sys
import unittest

from mmiolab import initramfs, kernel
from kitcfg import BUILD, CFG, TREE

KUNIT_KO = os.path.join(TREE.obj, "drivers", "misc", "mmiosim", "mmiosim_kunit.ko")
DEBUG_TREE = kernel.tree(CFG, debug=True)
DEBUG_KERNEL = DEBUG_TREE.bzimage
DEBUG_KUNIT_KO = os.path.join(DEBUG_TREE.obj, "drivers", "misc", "mmiosim", "mmiosim_kunit.ko")
KUNIT_PY = os.path.join(TREE.src, "tools", "testing", "kunit", "kunit.py")


def need_guest(test: unittest.TestCase) -> None:
    """Fail (not skip) when the kernel or initramfs is missing: make check builds them."""
    for path in (TREE.bzimage, initramfs.base(CFG)):
        if not os.path.exists(path):
            test.fail(f"{path} missing: run 'make kernel initramfs' first")


def log_dir(name: str) -> str:
    d = os.path.join(BUILD, "tests", name)
    os.makedirs(d, exist_ok=True)
    return d


def report(msg: str) -> None:
    print(f"     {msg}", file=sys.stderr, flush=True)


def fixture_floor(runs: int) -> int:
    """The fewest failed runs that still fit "a wrong fix fails at least 95
    runs in 100": 5% may pass, and never fewer than one, since with 10 runs a
    single pass is what a 95% (or a 99%) failure rate often gives."""
    return runs - max(1, runs * 5 // 100)
