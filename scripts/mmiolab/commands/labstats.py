"""Measure a lab's claims over many seeded runs and print the table.

  scripts/labstats [--lab doorbell] [--seeds 100] [--cmds N] [--only PATTERN ...]
                   [--extra-only] [--budget SECONDS]

For the starter (also under the pc profile, where writes are posted but
stay in order; for doorbell under 5.2 locking too, for modern under 2004),
each reference solution and each wrong-fix fixture, and for each of the
lab's per-seed tests: how many of the seeded runs failed, the median
count (submissions or sessions) until the first failure, the median
throughput, and the wall time of the variant's guest run. --extra-only keeps
the rows under another fabric than the lab's (lab.toml's [[labstats]]).
--budget stops a row's guest after SECONDS; the row then counts the seeds that
reported and says "partial". The test suite asserts the same claims at a
smaller count.
"""

from __future__ import annotations

import argparse
import fnmatch

from .. import initramfs
from ..config import Config
from ..labspec import load_lab
from ..lab import RACE_CMDS
from ..labtest import run_variant, variants


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lab", default="doorbell")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--cmds", type=int, default=RACE_CMDS,
                    help="commands per CPU per race run (default: the grader's, %(default)s)")
    ap.add_argument("--only", action="append", metavar="PATTERN",
                    help="rows whose variant matches this shell pattern (fixture:*, "
                         "correct:*, starter, ...; repeatable); the hidden rows too")
    ap.add_argument("--extra-only", action="store_true",
                    help="only the rows under another fabric (lab.toml's [[labstats]]: pc, "
                         "qemu, the other locking), not the lab's own fabric or the hidden tests")
    ap.add_argument("--budget", type=float, metavar="SECONDS",
                    help="stop each row's guest (a variant, one fabric) after SECONDS and "
                         "count the seeds that reported, marked 'partial: N of M seeds'; "
                         "default: none, each run stops at its time limit only (lab.toml's "
                         "run_timeout, scaled from the lab's default seeds to --seeds)")


def run(args: argparse.Namespace, cfg: Config) -> int:
    spec = load_lab(args.lab)
    seeds = list(range(1, args.seeds + 1))
    todo: list[tuple[str, list[str]]] = [(v, []) for v in variants(spec)]
    todo[1:1] = [(row.variant, row.append) for row in spec.labstats]
    # The hidden tests (a second guest: more CPUs, other routes) for the
    # starter, the solutions and the correct variants, and for the wrong fixes.
    todo += [(v, ["hidden"]) for v in variants(spec) if spec.hidden_tests]
    if args.extra_only:
        todo = [(v, a) for v, a in todo if a and a != ["hidden"]]
    if args.only:
        todo = [(v, a) for v, a in todo if any(fnmatch.fnmatchcase(v, p) for p in args.only)]
        if not todo:
            args.parser.error(f"no variant of {spec.name} matches {' '.join(args.only)}: "
                              f"{' '.join(variants(spec))}")
    initramfs.build(cfg)
    fabric = " ".join(f"{k}={v}" for k, v in spec.fabric.items())
    print(f"lab {spec.name}, fabric {fabric}, {len(seeds)} seeds per row")
    print(f"{'variant':32} {'extra':16} {'test':18} {'failed':>9} {'1st fail':>9} "
          f"{'cmds/s':>8} {'time':>6}")
    for variant, append in todo:
        hidden = append == ["hidden"]
        tallies = run_variant(spec, variant, seeds, append=[] if hidden else append,
                              cmds=args.cmds, hidden=hidden, stop_after=args.budget, cfg=cfg)
        for t in tallies.values():
            thr = sorted(t.throughput)[len(t.throughput) // 2] if t.throughput else 0
            first = t.median_first_failure
            extra = "hidden" if hidden else " ".join(a.split(".", 1)[1] for a in append) or "-"
            print(f"{variant:32} {extra:16} "
                  f"{t.test:18} {t.failed:>4}/{t.runs:<4} {first if first is not None else '-':>9} "
                  f"{thr:>8.0f} {t.seconds:>5.0f}s{t.partial_note()}", flush=True)
    return 0
