"""Unpack, patch, configure and build the lab kernel (--debug: the debug
kernel, build/kernel-debug)."""

from __future__ import annotations

import argparse

from .. import kernel
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--force", action="store_true", help="re-unpack and re-patch the tree")
    ap.add_argument("--debug", action="store_true", default=None,
                    help="the debug kernel (lockdep, KFENCE...: vm/debug.config) in build/kernel-debug")


def overrides(args: argparse.Namespace) -> dict[str, object]:
    return {"debug": args.debug}          # else MMIOLAB_DEBUG's


def run(args: argparse.Namespace, cfg: Config) -> int:
    kernel.build(force=args.force, t=kernel.tree(cfg))
    return 0
