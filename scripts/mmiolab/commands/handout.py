"""Pack the student handout of one or more labs: the kit without the answers.

  scripts/handout [--out DIR] [LAB ...]     (default: every lab, into build/handout)

For each lab it writes DIR/mmiolab-LAB.tar.gz: the kit (scripts, vm, patches,
Makefile), the lab without its solutions and wrong-fix fixtures, the student
edition of the HTML docs, the lab kernel and initramfs built (with what a
module build needs), and a HANDOUT.md that says what to do. The docs are
also left in DIR/site, ready to publish on a course web site.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile

from .. import MmiolabError, handout
from ..config import Config
from ..labspec import lab_names, load_lab
from ..progress import step


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", help="where the tarballs go (default: build/handout)")
    ap.add_argument("labs", nargs="*", metavar="LAB", help="labs to pack (default: all)")


def run(args: argparse.Namespace, cfg: Config) -> int:
    try:
        specs = [load_lab(name) for name in (args.labs or lab_names())]
        out = os.path.abspath(args.out or handout.default_out(cfg))
        with step("handout: student docs", tick=True):
            site = handout.build_site(os.path.join(out, "site"), cfg)
        built = handout.prebuilt(cfg=cfg)
        for spec in specs:
            path = handout.pack(spec, site, out, built=built, cfg=cfg)
            with tarfile.open(path) as tar:
                n = len(tar.getmembers())
            print(f"mmiolab: handout {spec.name}: {path} ({n} files, "
                  f"{os.path.getsize(path) / 1e6:.1f} MB)")
        print(f"mmiolab: handout: student docs in {site}/index.html")
    except MmiolabError as e:               # status 1, as scripts/handout always said
        print(f"mmiolab: handout: {e}", file=sys.stderr)
        return 1
    return 0
