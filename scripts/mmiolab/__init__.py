"""Host-side tooling of the mmiolab kit (standard library only; run with /usr/bin/python3)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class MmiolabError(Exception):
    """The base of the kit's own errors: what a command can say in one line
    instead of a traceback (python3 -m mmiolab catches it once)."""

