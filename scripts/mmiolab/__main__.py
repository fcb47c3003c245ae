"""The kit's one command: python3 -m mmiolab SUBCOMMAND [ARGS...]

Run from the top of the kit as the Makefiles run it:

  PYTHONPATH=scripts /usr/bin/python3 -m mmiolab grade --lab doorbell alice.c

Each subcommand is a module of mmiolab/commands/ (its --help says what its
arguments are); the scripts in scripts/ (grade, kit, handout...) call this
main with theirs. main builds the one parser, then the kit's configuration
once (config.Config: the environment's MMIOLAB_* and the arguments that set
it), and runs the subcommand with both. An error of the kit's own
(MmiolabError) that a subcommand does not explain itself is said here in one
line, exit status 2, instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from . import MmiolabError
from .commands import COMMANDS
from .config import Config


def usage() -> str:
    width = max(map(len, COMMANDS))
    return ("usage: python3 -m mmiolab SUBCOMMAND [ARGS...]   (SUBCOMMAND --help for its own)\n\n"
            + "\n".join(f"  {name:{width}}  {what}" for name, (_, _, what) in COMMANDS.items()))


def command(name: str) -> ModuleType | None:
    """The module of subcommand `name`, or None where this kit leaves it (or a
    module it needs) out: a student handout or an autograder carries no
    instructor's tools (handout.INSTRUCTOR_TOOLS)."""
    module = COMMANDS[name][0]
    try:
        return importlib.import_module(module if "." in module else f".commands.{module}",
                                       __package__)
    except ModuleNotFoundError as e:
        if (e.name or "").startswith(__package__ + "."):
            return None
        raise


def parser(name: str, module: ModuleType) -> argparse.ArgumentParser:
    """The parser with its subcommands; only `name`'s arguments are added (only
    its module is imported)."""
    top = argparse.ArgumentParser(prog="python3 -m mmiolab", add_help=False)
    subs = top.add_subparsers(dest="command", required=True)
    for each, (_, prog, what) in COMMANDS.items():
        sub = subs.add_parser(each, prog=prog, help=what)
        if each == name:
            sub.description = module.__doc__
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
            module.add_arguments(sub)
            sub.set_defaults(parser=sub)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name = argv[0]
    if name not in COMMANDS:
        print(f"mmiolab: no subcommand {name!r}\n{usage()}", file=sys.stderr)
        return 2
    module = command(name)
    if module is None:
        print(f"mmiolab: {name}: not in this kit (a student handout or an autograder "
              f"carries no instructor's tools)", file=sys.stderr)
        return 2
    args, extra = parser(name, module).parse_known_args(argv)
    if extra:               # said by the subcommand's parser, in its words
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        cfg = Config.from_env(os.environ, **getattr(module, "overrides", lambda a: {})(args))
        status: int = module.run(args, cfg)
        return status
    except MmiolabError as e:
        print(f"mmiolab: {name}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
