"""The kit's one command: python3 -m mmiolab SUBCOMMAND [ARGS...]

Run from the top of the kit as the Makefiles run it:

  PYTHONPATH=scripts /usr/bin/python3 -m mmiolab grade --lab doorbell alice.c

Each subcommand is one of the kit's entry points, run with the arguments as
given (its own --help says what they are): `python3 -m mmiolab grade ...` is
`scripts/grade ...`, `python3 -m mmiolab labvm ...` is `scripts/kit labvm ...`.
The scripts keep working as before. An error of the kit's own (MmiolabError)
that an entry point does not explain itself is said here in one line, exit
status 2, instead of a traceback.
"""

from __future__ import annotations

import os
import runpy
import sys

from . import ROOT, MmiolabError

SCRIPTS = os.path.join(ROOT, "scripts")

# subcommand: (the script under scripts/, the words put before the arguments, what it does)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "grade": ("grade", (), "grade lab submissions in the lab VM"),
    "kernel": ("kit", ("kernel",), "unpack, patch and build the lab kernel"),
    "initramfs": ("kit", ("initramfs",), "build the guest's initramfs"),
    "vm": ("kit", ("vm",), "the interactive lab VM (leave with Ctrl-A X)"),
    "run": ("kit", ("run",), "boot, run a command in the guest, print its output"),
    "bench": ("kit", ("bench",), "the fabric's benchmark in a guest"),
    "bisect": ("kit", ("bisect",), "build every prefix of the patch series"),
    "labvm": ("kit", ("labvm",), "a lab's VM with your driver in it"),
    "timeline": ("kit", ("timeline",), "draw a run recorded in the lab VM"),
    "merge": ("gradebook", ("merge",), "merge results and gradebook shards into one gradebook"),
    "handout": ("handout", (), "each lab's student handout"),
    "gradescope": ("gradescope", (), "a lab's Gradescope autograder zip"),
    "prairielearn": ("prairielearn", (), "a lab's PrairieLearn question and grader image"),
    "labstats": ("labstats", (), "measure a lab's claims over many seeded runs"),
    "demo": ("demo", (), "build the kit and show it working"),
    "trace-timeline": ("trace-timeline", (), "record the docs' doorbell traces"),
    "coldstart": ("coldstart", (), "time a cold clone's make demo and make check"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    return ("usage: python3 -m mmiolab SUBCOMMAND [ARGS...]   (SUBCOMMAND --help for its own)\n\n"
            + "\n".join(f"  {name:{width}}  {what}" for name, (_, _, what) in COMMANDS.items()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"mmiolab: no subcommand {name!r}\n{usage()}", file=sys.stderr)
        return 2
    script, words, _ = COMMANDS[name]
    try:
        if script == "gradebook":
            from . import gradebook
            return gradebook.main([*words, *args])
        path = os.path.join(SCRIPTS, script)
        if not os.path.exists(path):
            print(f"mmiolab: {name}: not in this kit (a student handout or an autograder "
                  f"carries no instructor's tools)", file=sys.stderr)
            return 2
        saved = sys.argv
        sys.argv = [path, *words, *args]
        try:
            runpy.run_path(path, run_name="__main__")
        finally:
            sys.argv = saved
    except MmiolabError as e:
        print(f"mmiolab: {name}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
