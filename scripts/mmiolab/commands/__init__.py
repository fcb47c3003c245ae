"""The subcommands of python3 -m mmiolab, one module each.

Each module has add_arguments(parser) and run(args, cfg) -> int (the exit
status), and may have overrides(args) -> dict: the Config fields its
arguments set (vm --smp 4). __main__.py builds the one parser, the Config
(Config.from_env(os.environ, **overrides)) and catches MmiolabError.

A grading platform's pack subcommand is its own folder's command.py
(platforms/NAME/command.py), listed here from the registry: adding a
platform adds its subcommand with no line here.
"""

import argparse
import sys
from collections.abc import Callable

from .. import MmiolabError, labspec
from ..platforms import PLATFORMS


def add_pack_arguments(ap: argparse.ArgumentParser, packs: str, out: str, where: str) -> None:
    """--lab, --out and --allow-unconfined-build, as gradescope and prairielearn
    take them: packs are what is made, out its default folder, where the place
    it grades in."""
    ap.add_argument("--lab", action="append", choices=labspec.lab_names(),
                    help="this lab (repeatable; default: every lab)")
    ap.add_argument("--out", help=f"where the {packs} go (default: {out})")
    ap.add_argument("--allow-unconfined-build", action="store_true",
                    help=f"grade even where {where} cannot confine builds (reports say so)")


def pack_each(prog: str, labs: list[str], pack: Callable[[str], str],
              say: Callable[[str], str]) -> int:
    """Pack each lab (gradescope, prairielearn): the first that fails is named,
    status 1; each made is said in one line."""
    for name in labs:
        try:
            path = pack(name)
        except (MmiolabError, OSError) as e:
            print(f"{prog}: {name}: {e}", file=sys.stderr)
            return 1
        print(f"{prog}: {say(path)}")
    return 0


# subcommand: (its module, here or absolute, its usage name, what it does). The
# usage name is the script's it was before (scripts/grade, scripts/kit labvm...):
# usage and error lines read as they did.
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "grade": ("grade", "grade", "grade lab submissions in the lab VM"),
    "kernel": ("kernel", "kit kernel", "unpack, patch and build the lab kernel"),
    "initramfs": ("initramfs", "kit initramfs", "build the guest's initramfs"),
    "vm": ("vm", "kit vm", "the interactive lab VM (leave with Ctrl-A X)"),
    "run": ("run", "kit run", "boot, run a command in the guest, print its output"),
    "bench": ("bench", "kit bench", "the fabric's benchmark in a guest"),
    "bisect": ("bisect", "kit bisect", "build every prefix of the patch series"),
    "labvm": ("labvm", "kit labvm", "a lab's VM with your driver in it"),
    "timeline": ("timeline", "kit timeline", "draw a run recorded in the lab VM"),
    "merge": ("merge", "python3 -m mmiolab merge",
              "merge results and gradebook shards into one gradebook"),
    "handout": ("handout", "handout", "each lab's student handout"),
    "labstats": ("labstats", "labstats", "measure a lab's claims over many seeded runs"),
    "demo": ("demo", "demo", "build the kit and show it working"),
    "trace-timeline": ("trace_timeline", "trace-timeline", "record the docs' doorbell traces"),
    "coldstart": ("coldstart", "coldstart", "time a cold clone's make demo and make check"),
    "bench-grade": ("bench_grade", "python3 -m mmiolab bench-grade",
                    "the CPU of one grade per lab, phase by phase"),
    "calibrate": ("calibrate", "kit calibrate",
                  "measure this machine's guest speed and a submission's time here"),
}

# The platforms' pack subcommands (scripts/gradescope, ...) come after handout,
# the other packer.
COMMANDS: dict[str, tuple[str, str, str]] = {}
for _name, _entry in _COMMANDS.items():
    COMMANDS[_name] = _entry
    if _name == "handout":
        COMMANDS.update({p.name: (p.command, p.name, p.packs) for p in PLATFORMS.values()})
