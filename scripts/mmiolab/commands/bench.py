"""Run the fabric benchmark (vm/bench) in a guest and print its KTAP."""

from __future__ import annotations

import argparse
import os
import sys

from .. import ROOT, kernel, vm
from ..lab import run_booted
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--append", action="append", default=[],
                    help="kernel command-line words, e.g. mmiosim.card=0")


def run(args: argparse.Namespace, cfg: Config) -> int:
    """Build vm/bench with Kbuild, load it in a guest, print its KTAP."""
    src = os.path.join(ROOT, "vm", "bench")
    out = os.path.join(cfg.build, "bench")
    (ko,) = kernel.build_module(src, out, os.path.join(out + "-build.log"), kernel.tree(cfg))
    # The guest's console is kept (build/bench/guest): a failure is rare
    # (one panic in some fifty runs, cause unknown) and needs its log.
    res = run_booted("insmod /job/mmiosim_bench.ko && dmesg", {"/job/mmiosim_bench.ko": ko},
                     vm.VMConfig.from_config(cfg, append=args.append, timeout=300),
                     os.path.join(out, "guest"))
    lines = res.console.splitlines()
    start = next((i for i, line in enumerate(lines) if "Subtest: mmiosim_bench" in line), None)
    if not res.ok or start is None:
        print(f"mmiolab: bench failed: {res.describe()} (console: {res.log})", file=sys.stderr)
        return 1
    for line in lines[start - 1:]:
        text = line.split("] ", 1)[-1]
        print(text)
        if text.startswith(("ok 1 mmiosim_bench", "not ok 1 mmiosim_bench")):
            break
    return 0
