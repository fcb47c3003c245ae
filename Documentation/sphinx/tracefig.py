"""Sphinx extension: timelines drawn from recorded mmiosim traces.

    .. mmiosim-timeline:: ../figures/race-trace.txt
       :title: The doorbell race, as traced

       Caption: a paragraph, parsed as reStructuredText; further paragraphs
       become the figure's legend.

The argument is a trace recorded by scripts/trace-timeline (ftrace output of
the lab kernel's mmiosim trace events, relative to the including document,
or to the source directory if it starts with "/"). It is parsed at build
time and drawn as an inline SVG by scripts/mmiolab/timeline.py: one lane per CPU, the I/O bridge and the
device; every write from post to bridge to arrival, overtaken writes and
stale doorbells in red; mmiowb() waits and reads on their CPU's lane; time
in microseconds. HTML builders only. A trace that cannot be drawn is a
build error, not an empty figure.

Options: :title: (the SVG's title), :width: (pixels, default 960),
:doorbell: (the register offset drawn as the doorbell, default the card's
MMIOSIM_RING_DOORBELL, read from include/linux/mmiosim_ring.h),
:name: (a label for :ref:/:numref:).
"""

import os
import sys

from docutils import nodes
from docutils.parsers.rst import Directive, directives

# The drawing is the kit's one implementation, scripts/mmiolab/timeline.py
# (standard library only), which the student's and the grader's pictures use too.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts"))
from mmiolab import kernel  # noqa: E402
from mmiolab import timeline as mmiosim_trace  # noqa: E402
from mmiolab.config import Config  # noqa: E402

__version__ = "1.0"


class TimelineDirective(Directive):
    required_arguments = 1
    optional_arguments = 0
    final_argument_whitespace = False
    has_content = True
    option_spec = {
        "title": directives.unchanged,
        "width": directives.positive_int,
        "doorbell": lambda s: int(s, 0),
        "name": directives.unchanged,
        "align": lambda s: directives.choice(s, ("left", "center", "right")),
    }

    def run(self):
        env = self.state.document.settings.env
        rel, path = env.relfn2path(self.arguments[0])
        env.note_dependency(rel)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise self.error(f"mmiosim-timeline: cannot read {self.arguments[0]}: {e}")
        try:
            # The card's register names: the lab kernel's header, in the
            # kernel tree the environment names (MMIOLAB_BUILD), as the kit's
            # command would find it (this extension is an entry point too).
            ring = mmiosim_trace.ring(kernel.tree(Config.from_env()).src)
            trace = mmiosim_trace.parse(text, ring=ring)
            n = env.new_serialno("mmiosim-timeline")
            ident = f"mmiosim-tl-{env.docname.replace('/', '-')}-{n}"
            svg = mmiosim_trace.render_svg(
                trace, title=self.options.get("title", ""),
                width=self.options.get("width", 960), ident=ident,
                doorbell=self.options.get("doorbell"))
        except mmiosim_trace.TraceError as e:
            raise self.error(f"mmiosim-timeline: {self.arguments[0]}: {e}")

        figure = nodes.figure(classes=["mmiosim-timeline-figure"])
        figure["align"] = self.options.get("align", "center")
        figure += nodes.raw("", f'<div class="mmiosim-timeline-wrap">{svg}</div>',
                            format="html")
        if self.content:
            holder = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, holder)
            first = holder[0] if len(holder) else None
            if isinstance(first, nodes.paragraph):
                caption = nodes.caption(first.rawsource, "", *first.children)
                caption.source, caption.line = first.source, first.line
                figure += caption
                rest = holder.children[1:]
            else:
                rest = holder.children
            rest = list(rest)
        else:
            rest = []
        rest += self.provenance(trace.header, os.path.relpath(path, os.path.dirname(env.srcdir)))
        if rest:
            figure += nodes.legend("", *rest)
        self.add_name(figure)
        return [figure]

    def provenance(self, header, where):
        """What the recording says about itself (its "# key: value" header)."""
        if not header.get("driver"):
            return []
        para = nodes.paragraph(classes=["mmiosim-timeline-provenance"])
        para += nodes.strong("", "Recorded run: ")
        parts = [("", header.get("driver")), (" under ", header.get("command")),
                 (" (one test thread per CPU), ", header.get("cpus") and f"{header['cpus']} virtual CPUs"
                  + (f" under QEMU ({header['accel'].upper()})" if header.get("accel") else "")),
                 ("; lab kernel ", header.get("kernel")),
                 ("; fabric ", header.get("fabric")),
                 ("; recorded ", header.get("date")),
                 (". It shows ", header.get("shows")),
                 (". The test's verdict: ", header.get("result")),
                 (". Excerpt: ", where),
                 (", ", header.get("excerpt"))]
        for sep, value in parts:
            if not value:
                continue
            if sep:
                para += nodes.Text(sep)
            if sep in ("", " under ", "; fabric ", ". Excerpt: "):
                para += nodes.literal(value, value)
            else:
                para += nodes.Text(value)
        para += nodes.Text(".")
        return [para]


def setup(app):
    app.add_directive("mmiosim-timeline", TimelineDirective)
    return {"version": __version__, "parallel_read_safe": True, "parallel_write_safe": True}
