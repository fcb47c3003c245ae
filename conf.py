# Sphinx configuration for the mmiolab documentation.
#
# Sources live in Documentation/, this file at the repository root. Build with
#
#   /usr/bin/python3 -m sphinx -W --keep-going -n -b html -c . Documentation build/docs/html
#
# (that is what `make docs` runs). Everything here must work offline with
# Debian's python3-sphinx (5.3) and python3-sphinx-rtd-theme: no extension or
# asset may be fetched from the network at build or view time.
#
# Paths below (html_static_path, templates_path) are relative to this file's
# directory, not to Documentation/.

import os

project = "mmiolab"
author = "the mmiolab authors"
copyright = "the mmiolab authors"
html_title = "mmiolab: MMIO write ordering on Linux"
html_short_title = "mmiolab"

extensions = [
    "sphinx.ext.extlinks",
]

# Where a source is cited by a stable identifier, these roles make it a link.
extlinks = {
    "commit": ("https://git.kernel.org/torvalds/c/%s", "commit %s"),
    "lwn": ("https://lwn.net/Articles/%s/", "LWN %s"),
    "cve": ("https://www.cve.org/CVERecord?id=%s", "%s"),
}

root_doc = "index"
source_suffix = {".rst": "restructuredtext"}
exclude_patterns = []
language = "en"
primary_domain = "c"
highlight_language = "none"
pygments_style = "sphinx"
nitpicky = True
# Kernel annotations the C domain should accept in declarations.
c_id_attributes = ["__iomem", "__must_check", "__always_inline"]

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
html_favicon = os.path.join("Documentation", "_static", "favicon.svg")
