"""A lab's VM with your driver in it, built as the grader builds it
(make -C labs/LAB vm)."""

from __future__ import annotations

import argparse
import os
import sys

from .. import explore, labspec
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lab", required=True, choices=labspec.lab_names())
    ap.add_argument("--submission", help="the driver source (default: the lab's starter)")
    ap.add_argument("--shown", help="how to name the submission in messages")
    ap.add_argument("--fabric", default="", help="fabric parameters, e.g. 'profile=pc seed=3'")
    ap.add_argument("--smp", type=int, default=0)
    ap.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="")


def run(args: argparse.Namespace, cfg: Config) -> int:
    spec = labspec.load_lab(args.lab)
    source = args.submission or os.path.join(spec.dir, "starter", spec.files[0])
    shown = args.shown or os.path.relpath(source)
    try:
        return explore.labvm(spec, source, shown, args.fabric, args.smp, args.accel, cfg=cfg)
    except explore.ExploreError as e:       # the student's to fix: said as it is, status 1
        print(f"mmiolab: {e}", file=sys.stderr)
        return 1
