# Sphinx configuration for the mmiolab documentation.
#
# Sources live in Documentation/, this file at the repository root. Build with
#
#   /usr/bin/python3 -m sphinx -W --keep-going -n -b html -c . Documentation build/docs/html
#
# (that is what `make docs` runs, after `make kernel`: the patched kernel tree
# is needed, see below). Everything here must work offline with Debian's
# python3-sphinx (5.3) and python3-sphinx-rtd-theme: no extension or asset may
# be fetched from the network at build or view time. The kit's own extension,
# Documentation/sphinx/tracefig.py, draws timelines from recorded traces.
#
# Paths below (html_static_path, templates_path) are relative to this file's
# directory, not to Documentation/.

import os
import sys

import sphinx

ROOT = os.path.dirname(os.path.abspath(__file__))

# The API reference is extracted with kernel-doc from the patched kernel tree
# (build/kernel/src, made by `make kernel`), with the tree's own Sphinx
# extensions: kerneldoc.py (which imports kernellog.py from the same
# directory) and kernel_include.py. Without that tree the docs cannot be
# built: fail loudly rather than silently drop the API pages.
# MMIOLAB_BUILD moves build/ (as it does for scripts/kit).
KERNEL_SRC = os.path.join(os.environ.get("MMIOLAB_BUILD", os.path.join(ROOT, "build")),
                          "kernel", "src")
KERNEL_SPHINX = os.path.join(KERNEL_SRC, "Documentation", "sphinx")
_needed = [os.path.join(KERNEL_SPHINX, "kerneldoc.py"),
           os.path.join(KERNEL_SRC, "scripts", "kernel-doc"),
           os.path.join(KERNEL_SRC, "include", "linux", "mmiosim.h"),
           os.path.join(KERNEL_SRC, "Documentation", "driver-api", "mmiosim.rst")]
_missing = [p for p in _needed if not os.path.exists(p)]
if _missing:
    raise RuntimeError(
        "mmiolab docs: the patched kernel tree is missing or incomplete "
        f"(no {os.path.relpath(_missing[0], ROOT)}). The API reference is "
        "extracted from it with kernel-doc: run `make kernel` first.")
sys.path.insert(0, KERNEL_SPHINX)
# The kit's own Sphinx extensions (tracefig: timelines from recorded traces).
sys.path.insert(0, os.path.join(ROOT, "Documentation", "sphinx"))
# kernel-include expands environment variables in its path, as in the kernel.
os.environ["srctree"] = KERNEL_SRC

kerneldoc_bin = os.path.join(KERNEL_SRC, "scripts", "kernel-doc")
kerneldoc_srctree = KERNEL_SRC

project = "mmiolab"
author = "the mmiolab authors"
copyright = "the mmiolab authors"
html_title = "mmiolab: MMIO write ordering on Linux"
html_short_title = "mmiolab"

extensions = [
    "sphinx.ext.extlinks",
    "kerneldoc",
    "kernel_include",
    "tracefig",
    "labvariants",
    "figures",
]

# Where a source is cited by a stable identifier, these roles make it a link.
extlinks = {
    "commit": ("https://git.kernel.org/torvalds/c/%s", "commit %s"),
    "lwn": ("https://lwn.net/Articles/%s/", "LWN %s"),
}
# Sphinx 8.1 (Debian 13) has a :cve: role of its own; 5.3 (Debian 12) does not.
if sphinx.version_info < (8, 1):
    extlinks["cve"] = ("https://www.cve.org/CVERecord?id=%s", "%s")

root_doc = "index"
# Two editions. By default (the instructor's) each lab page shows the reference
# solutions and the wrong fixes the grader rejects; "-t student", as
# scripts/handout builds the pages students get, leaves them out.
if not tags.has("student"):  # noqa: F821 (Sphinx puts tags in this namespace)
    tags.add("instructor")  # noqa: F821
source_suffix = {".rst": "restructuredtext"}
exclude_patterns = []
language = "en"
primary_domain = "c"
highlight_language = "none"
pygments_style = "sphinx"
nitpicky = True
# Kernel annotations the C domain should accept in declarations.
c_id_attributes = ["__iomem", "__must_check", "__always_inline", "VISIBLE_IF_KUNIT"]

# Reproducible output: no build date, no "view source" links into the tree.
html_last_updated_fmt = None
html_show_sourcelink = False
html_copy_source = False
html_show_sphinx = False

html_theme = "sphinx_rtd_theme"
html_theme_options = {
    "collapse_navigation": False,
    "navigation_depth": 3,
    "prev_next_buttons_location": "both",
    "style_external_links": True,
}
html_static_path = [os.path.join("Documentation", "_static")]
html_css_files = ["mmiolab.css"]

# Kernel types used in C declarations; they are not documented here.
nitpick_ignore = [("c:identifier", t) for t in ("u8", "u16", "u32", "u64", "size_t", "phys_addr_t")]
# The fabric's window handle is opaque (struct mmiosim_window is declared, not
# defined, in include/linux/mmiosim.h), so kernel-doc has nothing to document.
nitpick_ignore += [("c:identifier", "mmiosim_window")]
html_favicon = os.path.join("Documentation", "_static", "favicon.svg")


def _tidy_literal_includes(app, doctree):
    """Two touches to literalinclude blocks, after they are read.

    A :diff: names the files by their absolute paths: show them from the
    kit's root. A block cut with :end-before: keeps the blank line before
    the marker, which Sphinx numbers: drop trailing blank lines.
    """
    from docutils import nodes
    prefix = ROOT + os.sep
    for node in doctree.findall(nodes.literal_block):
        text = node.astext()
        new = text
        if node.get("language") == "udiff":
            new = new.replace(prefix, "")
        elif node.get("source") and new.endswith("\n\n"):
            new = new.rstrip("\n") + "\n"
        if new != text:
            node.rawsource = new
            node.children = []
            node += nodes.Text(new)


# The answer key's page, which in the student edition only says that it is
# for instructors. Sphinx's sidebar ignores "only" around a toctree, and
# excluding the page would break the toctree and the links that name it.
ANSWER_KEY = "instructor/teaching"


def _student_toctree(app, doctree):
    """In the student edition, take the answer key out of every toctree.

    Runs before Sphinx's own toctree collector reads the doctree, so the
    sidebar and the next/previous links skip the page; the page is still
    built (its :orphan: field keeps Sphinx from warning that no toctree
    includes it), so links to it resolve.
    """
    if not app.tags.has("student"):
        return
    from sphinx import addnodes
    for node in doctree.findall(addnodes.toctree):
        node["entries"] = [(title, doc) for title, doc in node["entries"]
                           if doc != ANSWER_KEY]
        node["includefiles"] = [doc for doc in node["includefiles"] if doc != ANSWER_KEY]


def setup(app):
    app.connect("doctree-read", _tidy_literal_includes)
    # Before the toctree collector (priority 500) sees the front page.
    app.connect("doctree-read", _student_toctree, priority=400)
