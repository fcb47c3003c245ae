"""Build every prefix of patches/series (each must build)."""

from __future__ import annotations

import argparse

from .. import kernel
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, cfg: Config) -> int:
    kernel.bisect_build(cfg)
    return 0
