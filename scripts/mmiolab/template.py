"""The text files the kit writes (shell scripts, Markdown, HTML, a
Dockerfile), kept as files in templates/ and filled with string.Template.

A value is marked @name@, as in autoconf's .in files, so that a shell
script's own ${...} and $x need no escaping; @@ is a literal @. A name the
caller does not give, or a lone @, is an error, not a silent gap.
"""

from __future__ import annotations

import os
import string

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


_AT_PATTERN = r"""@(?:
    (?P<escaped>@) |
    (?P<named>[a-z_]+)@ |
    (?P<braced>(?!)) |
    (?P<invalid>)
)"""


class _At(string.Template):
    delimiter = "@"
    # A string, which string.Template compiles for the subclass (typeshed
    # declares the compiled pattern).
    pattern = _AT_PATTERN  # type: ignore[assignment]


def fill(template: str, /, **values: str) -> str:
    """templates/TEMPLATE with each @key@ replaced by values[key]."""
    with open(os.path.join(TEMPLATES, template), encoding="utf-8") as f:
        return _At(f.read()).substitute(values)
