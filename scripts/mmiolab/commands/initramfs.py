"""Build the busybox-static initramfs (build/initramfs)."""

from __future__ import annotations

import argparse

from .. import initramfs
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, cfg: Config) -> int:
    initramfs.build(cfg)
    return 0
