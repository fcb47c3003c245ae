"""Boot, run CMD in the guest, print its output, exit with its status."""

from __future__ import annotations

import argparse
import sys

from .. import vm
from ..config import Config
from . import vm as vm_command

overrides = vm_command.overrides


def add_arguments(ap: argparse.ArgumentParser) -> None:
    vm_command.add_arguments(ap)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("command", nargs="+")


def run(args: argparse.Namespace, cfg: Config) -> int:
    res = vm.run(" ".join(args.command),
                 cfg=vm.VMConfig.from_config(cfg, append=args.append, timeout=args.timeout))
    sys.stdout.write(res.console)
    print(f"mmiolab: {res.describe()}", file=sys.stderr)
    if res.boot_seconds is not None:
        print(f"mmiolab: boot to first command {res.boot_seconds:.2f}s", file=sys.stderr)
    return res.exit_code if res.status == "exited" and res.exit_code is not None else 125
