"""Sphinx extension: a lab's correct variants and wrong fixes, as tables.

    .. lab-variants:: doorbell

reads labs/LAB/correct/*.patch and labs/LAB/fixtures/*.patch, whose first
lines say what each variant is ("Correct (NAME): why" and "Wrong fix (NAME):
why"), and renders two tables of name and why. The patches are what the
kit's test suite and scripts/labstats run, so the pages list exactly the
variants whose verdicts are measured. A patch without that first line is a
build error.
"""

import os
import re

from docutils import nodes
from docutils.parsers.rst import Directive

__version__ = "1.0"

LABS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "labs")
FIRST = {"correct": re.compile(r"Correct \(([\w-]+)\): (.+)"),
         "fixtures": re.compile(r"Wrong fix \(([\w-]+)\): (.+)")}


def _read(lab, folder):
    d = os.path.join(LABS, lab, folder)
    rows = []
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if not f.endswith(".patch"):
            continue
        with open(os.path.join(d, f), encoding="utf-8") as fh:
            text = fh.read()
        head = text.split("\n\n", 1)[0].replace("\n", " ")
        m = FIRST[folder].match(head)
        if not m or m.group(1) != f[:-6]:
            raise ValueError(f"labs/{lab}/{folder}/{f}: the first paragraph must say "
                             f"what the variant is ({FIRST[folder].pattern})")
        rows.append((m.group(1), m.group(2)))
    return rows


def _table(title, rows):
    table = nodes.table()
    group = nodes.tgroup(cols=2)
    table += group
    for width in (25, 75):
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for text in (title, "What it is"):
        entry = nodes.entry()
        entry += nodes.paragraph(text=text)
        row += entry
    head += row
    body = nodes.tbody()
    group += body
    for name, why in rows:
        row = nodes.row()
        entry = nodes.entry()
        entry += nodes.paragraph("", "", nodes.literal(text=name))
        row += entry
        entry = nodes.entry()
        entry += nodes.paragraph(text=why)
        row += entry
        body += row
    return table


class LabVariants(Directive):
    required_arguments = 1

    def run(self):
        lab = self.arguments[0]
        env = self.state.document.settings.env
        # Rebuild the page when a patch changes: an incremental build would
        # keep the old table. (Sphinx takes a dependency that is not a file
        # as changed on every build, so a patch added or removed is the
        # Makefile's to see: `make docs` reads every page again then.)
        for folder in ("correct", "fixtures"):
            d = os.path.join(LABS, lab, folder)
            for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                if f.endswith(".patch"):
                    env.note_dependency(os.path.join(d, f))
        try:
            good, bad = _read(lab, "correct"), _read(lab, "fixtures")
        except (OSError, ValueError) as e:
            raise self.error(str(e))
        return [_table("Correct variant (must pass)", good),
                _table("Wrong fix (must fail)", bad)]


def setup(app):
    app.add_directive("lab-variants", LabVariants)
    return {"version": __version__, "parallel_read_safe": True}
