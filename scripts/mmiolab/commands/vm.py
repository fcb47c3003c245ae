"""The interactive lab VM (leave with Ctrl-A X)."""

from __future__ import annotations

import argparse

from .. import vm
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Also run's: the guest's options (defaults: MMIOLAB_SMP, MMIOLAB_MEM,
    MMIOLAB_ACCEL, else 2 CPUs, 512M, auto)."""
    ap.add_argument("--smp", type=int)
    ap.add_argument("--memory")
    ap.add_argument("--accel", choices=("auto", "kvm", "tcg"))
    ap.add_argument("--append", action="append", default=[],
                    help="extra kernel command-line words (e.g. mmiosim.profile=pci)")


def overrides(args: argparse.Namespace) -> dict[str, object]:
    return {"smp": args.smp, "memory": args.memory, "accel": args.accel}


def run(args: argparse.Namespace, cfg: Config) -> int:
    return vm.interactive(vm.VMConfig.from_config(cfg, append=args.append))
