"""Merge results.json files, result folders and gradebook CSV shards into one
gradebook (also python3 -m mmiolab.gradebook merge)."""

from __future__ import annotations

import argparse
import sys

from .. import gradebook
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-o", "--out", default="gradebook.csv", help="gradebook to merge into")
    ap.add_argument("inputs", nargs="+", help="results.json, folders, or gradebook .csv files")


def run(args: argparse.Namespace, cfg: Config) -> int:
    rep = gradebook.merge(args.inputs, args.out)
    for p in rep.problems:
        print(f"mmiolab: merge: {p}", file=sys.stderr)
    print(f"mmiolab: {rep.path}: {rep.rows} students ({rep.added} added, {rep.replaced} "
          f"updated, {rep.kept} older kept out)")
    return 0
