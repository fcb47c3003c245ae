"""The grading platforms the kit grades in, by name (base.Platform says what
one is). Adding a platform: a folder platforms/NAME/ with __init__.py (its
contract, write_results, problems, PLATFORM), pack.py (pack, default_out),
command.py (its pack subcommand) and runner.py (image, job, read, ROOT_CHECK),
its templates in templates/, and one line below; its docs and test. The
grade command (--platform NAME, --NAME), the subcommands, scripts/containers
and scripts/cleanroot --check take it from here.
"""

from __future__ import annotations

from . import gradescope, prairielearn
from .base import Container, Platform

PLATFORMS: dict[str, Platform] = {p.name: p for p in (gradescope.PLATFORM,
                                                      prairielearn.PLATFORM)}


def platform(name: str) -> Platform:
    """The platform called `name` (KeyError names the known ones)."""
    try:
        return PLATFORMS[name]
    except KeyError:
        raise KeyError(f"no grading platform {name!r} (known: {', '.join(PLATFORMS)})") from None


__all__ = ["PLATFORMS", "Container", "Platform", "platform"]
