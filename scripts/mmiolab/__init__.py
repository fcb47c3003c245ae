"""Host-side tooling of the mmiolab kit (standard library only; run with /usr/bin/python3)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class MmiolabError(Exception):
    """The base of the kit's own errors: what a command can say in one line
    instead of a traceback (python3 -m mmiolab catches it once)."""


def __getattr__(name: str) -> str:
    # mmiolab.BUILD, read from the environment when asked (tests, callers
    # outside a command); the package's own code uses its Config's build.
    if name == "BUILD":
        from .config import Config
        return Config.from_env().build
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
