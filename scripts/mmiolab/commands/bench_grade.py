"""How much CPU one grade takes, phase by phase (make bench-grade; issue 35).

  python3 -m mmiolab bench-grade [--lab LAB]... [--solution LAB:NAME]...
                                 [--trace-share] [--json PATH]
  python3 -m mmiolab bench-grade --show PATH     print saved figures again

Grades each lab's reference solution (the first by name, or --solution's)
once, as scripts/grade does (the visible tests' guest, then the hidden
tests'), and prints a table per lab: the CPU-seconds of each phase (intake,
review, the confined build, object checks, each guest's boot and run, the
guest's user and kernel time, reading the guests' output, scoring, writing),
the grader's own and its children's (QEMU among them), wall time, and the
total measured around the grade, which the rows add up to
(scripts/mmiolab/gradebench.py says how). --trace-share runs each visible
guest once more without trace recording (left out of the totals): what the
recording costs. The figures go to build/bench-grade.json too. Outputs of
the grades: build/bench-grade/LAB. A benchmark, not a test: it asserts only
that the reference solution was graded and the rows add up.

What ran before (the batch's setup: the initramfs, the confinement probe,
the guest programs' and the kernel macros' caches, the KVM probe) is not in
the tables: a batch pays it once, not per submission.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from .. import ROOT, gradebench, initramfs, kernel, lab, labspec, stages, vm
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lab", action="append", choices=labspec.lab_names(),
                    help="this lab (repeatable; default: every lab)")
    ap.add_argument("--solution", action="append", default=[], metavar="LAB:NAME",
                    help="grade this reference solution of LAB (default: its first by name)")
    ap.add_argument("--trace-share", action="store_true",
                    help="run each visible guest once more, recording no trace (not counted)")
    ap.add_argument("--patience", type=float, default=1.0, metavar="N",
                    help="multiply the guests' time limits by N (a host loaded by others)")
    ap.add_argument("--json", help="where the figures go (default: build/bench-grade.json)")
    ap.add_argument("--show", metavar="PATH", help="print the tables of saved figures, no grading")


def run(args: argparse.Namespace, cfg: Config) -> int:
    if args.show:
        for t in gradebench.load(args.show):
            print(gradebench.render(t) + "\n")
        return 0
    chosen = {}
    for item in args.solution:
        name, _, sol = item.partition(":")
        if not sol:
            print(f"bench-grade: --solution {item}: give LAB:NAME", file=sys.stderr)
            return 2
        chosen[name] = sol
    if not os.path.exists(kernel.tree(cfg).bzimage):
        print("bench-grade: the lab kernel is not built: run 'make kernel initramfs'",
              file=sys.stderr)
        return 2
    level, why = lab.confinement(cfg)
    if not level:
        print(f"bench-grade: cannot confine the module builds here: {why}", file=sys.stderr)
        return 2
    specs = [labspec.load_lab(n) for n in (args.lab or labspec.lab_names())]
    # The batch's setup, once (scripts/grade pays it once per batch).
    initramfs.build(cfg)
    vm.choose_accel(vm.VMConfig.from_config(cfg))
    stages.kernel_macros_file(cfg)
    todo = []
    for spec in specs:
        sol = chosen.get(spec.name) or (spec.solutions[0] if spec.solutions else "")
        if not sol:
            print(f"bench-grade: lab {spec.name} has no reference solution", file=sys.stderr)
            return 2
        lab.guest_programs(spec, cfg)
        spec.solution_source(sol, cfg)
        todo.append((spec, sol))
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    about = {"commit": head, "when": time.strftime("%Y-%m-%d %H:%M %Z"),
             "cpus": os.cpu_count(), "load_start": round(os.getloadavg()[0], 2),
             "nice": os.nice(0), "accel": vm.choose_accel(vm.VMConfig.from_config(cfg)),
             "confinement": level, "guest_smp": cfg.smp, "patience": args.patience}
    print(f"bench-grade: {head}, {about['cpus']} CPUs, load average {about['load_start']}, "
          f"nice {about['nice']}, {about['accel']}, builds confined by {level}"
          + (f", guests' time limits x{args.patience:g}" if args.patience != 1 else ""),
          flush=True)
    tables = []
    for spec, sol in todo:
        out = os.path.join(cfg.build, "bench-grade", spec.name)
        table = gradebench.measure(spec, sol, out, cfg, trace_share=args.trace_share,
                                   patience=args.patience)
        tables.append(table)
        print(gradebench.render(table) + "\n", flush=True)
    about["load_end"] = round(os.getloadavg()[0], 2)
    path = args.json or os.path.join(cfg.build, "bench-grade.json")
    gradebench.save(tables, path, about)
    print(f"bench-grade: figures in {path}; grades in {os.path.join(cfg.build, 'bench-grade')}")
    graded = all(t.verdict.endswith(", graded") for t in tables)
    if not graded:
        print("bench-grade: a reference solution was not graded: its figures measure "
              "something else", file=sys.stderr)
    return 0 if graded else 1
