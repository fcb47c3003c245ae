"""Sphinx extension: a measured number, read from its figures file at build time.

    the read-back took :figure:`bench cpu0.readback_ns` ns

renders the value KEY has in Documentation/figures/FILE.txt, so a page
cannot quote a number its figures file does not hold: the number is not
in the page at all. A file or key that does not exist is a build error
(the docs build with -W), and so is a figures file that does not say which
kernel and command made it.

Figures files are the output of a kit command, kept as it printed them,
under a header of "# key: value" lines that say what made them:

    # command: make bench
    # kernel: 6.12.118 lab kernel
    # date: 2026-12-07

``bench.txt`` (and ``bench-*.txt``, other runs) holds the KTAP that ``make bench`` prints
(vm/bench/mmiosim_bench.c); its diagnostic lines give these keys:

    cpuN.readback_ns, cpuN.mmiowb_ns   flushing 5 posted writes, ns
    cpuN.ratio                         read-back / mmiowb() (ratio_x100 / 100)
    handoffs, overtakes, profile       the strict lock hand-over run
    writel.hook_ns, writel.plain_ns    writel() to RAM, with and without the
                                       fabric's hook (ps / 1000, one decimal)
    lock.bookkeeping_ns, lock.plain_ns spin_lock()+spin_unlock(), with and
                                       without the mmiowb() bookkeeping
    lock.ratio                         their ratio (ratio_x100 / 100)

``containers-*.txt`` holds the JSON that ``scripts/containers --results``
writes, one entry per grading job; its keys, for LAB.SUBMISSION (e.g.
``doorbell.solution:mmiowb``), LAB.solutions, LAB.others (starter and
wrong fixes), solutions, others and all:

    KEY.seconds    the jobs' wall-clock seconds, "min-max" (rounded)
    KEY.runs       how many jobs
    KEY.score      their scores, "min-max"
    KEY.failed     every test that failed in any of them ("none")

and, in the header, ``setup_seconds`` and ``jail_seconds``: how long
setup.sh, and the jail's tree within it, took while the same run built the
images (copied from the run's log, which the header names).

Every file gives its header keys (command, kernel, date, ...), the
"# key: value" lines before its first line that is not a comment.
Integers are printed with thousands separators, as the pages write them.
"""

import json
import os
import re

from docutils import nodes

__version__ = "1.0"

FIGURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "figures")
REQUIRED = ("command", "kernel", "date")


class FiguresError(ValueError):
    """A figures file or key the page asks for that is not there."""


def _int(text):
    return f"{int(text):,}"


def _hundredths(text):
    return f"{int(text) / 100:.2f}"


def _ps_as_ns(text):
    return f"{int(text) / 1000:.1f}"


# One pattern per kind of KTAP diagnostic line mmiosim_bench.c prints, and
# how each named group becomes keys.
BENCH_LINES = [
    (re.compile(r"# cpu(?P<cpu>\d+): readback_ns=(?P<readback>\d+) "
                r"mmiowb_ns=(?P<mmiowb>\d+) ratio_x100=(?P<ratio>\d+)"),
     lambda m: {f"cpu{m['cpu']}.readback_ns": _int(m["readback"]),
                f"cpu{m['cpu']}.mmiowb_ns": _int(m["mmiowb"]),
                f"cpu{m['cpu']}.ratio": _hundredths(m["ratio"])}),
    (re.compile(r"# handoffs=(?P<handoffs>\d+) overtakes=(?P<overtakes>\d+) "
                r"profile=(?P<profile>\d+)"),
     lambda m: {"handoffs": _int(m["handoffs"]), "overtakes": _int(m["overtakes"]),
                "profile": m["profile"]}),
    (re.compile(r"# writel to RAM: (?P<hook>\d+) ps with the fabric hook, "
                r"(?P<plain>\d+) ps without"),
     lambda m: {"writel.hook_ns": _ps_as_ns(m["hook"]),
                "writel.plain_ns": _ps_as_ns(m["plain"])}),
    (re.compile(r"# spin_lock\+spin_unlock: (?P<with>\d+) ps with the mmiowb\(\) "
                r"bookkeeping, (?P<without>\d+) ps without, ratio_x100=(?P<ratio>\d+)"),
     lambda m: {"lock.bookkeeping_ns": _ps_as_ns(m["with"]),
                "lock.plain_ns": _ps_as_ns(m["without"]),
                "lock.ratio": _hundredths(m["ratio"])}),
]

def parse_bench(body):
    keys = {}
    for line in body.splitlines():
        for pattern, to_keys in BENCH_LINES:
            m = pattern.search(line)
            if m:
                keys.update(to_keys(m))
    return keys


def _span(values, fmt="{:.0f}"):
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def parse_containers(body):
    """The JSON list scripts/containers --results writes: one job per entry,
    with lab, submission ("starter", "solution:NAME", "fixture:NAME"),
    seconds and score."""
    jobs = json.loads(body)
    groups = {}
    for job in jobs:
        lab, sub = job["lab"], job["submission"]
        kind = "solutions" if sub.startswith("solution:") else "others"
        for key in (f"{lab}.{sub}", f"{lab}.{kind}", kind, "all"):
            groups.setdefault(key, []).append(job)
    keys = {}
    for key, group in groups.items():
        keys[f"{key}.seconds"] = _span([j["seconds"] for j in group])
        keys[f"{key}.runs"] = str(len(group))
        scores = [j["score"] for j in group if j["score"] is not None]
        if scores:
            keys[f"{key}.score"] = _span(scores)
        failed = sorted({t for j in group for t in j.get("failed", [])})
        keys[f"{key}.failed"] = ", ".join(failed) or "none"
    return keys


PARSERS = {"bench": parse_bench, "containers": parse_containers}


def read_figures(name, folder=FIGURES):
    """The keys of Documentation/figures/NAME.txt, as the pages print them:
    its header's "# key: value" lines, then what its parser reads from the
    rest (NAME up to its first "-" names the parser)."""
    kind = name.split("-")[0]
    if kind not in PARSERS:
        raise FiguresError(f"no parser for figures file {name}.txt "
                           f"(known: {', '.join(sorted(PARSERS))}, and NAME-*)")
    path = os.path.join(folder, name + ".txt")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise FiguresError(f"no figures file {path}") from None
    keys, n = {}, 0
    while n < len(lines) and lines[n].startswith("#"):
        head = re.match(r"#\s*(\w+):\s*(.+)", lines[n])
        if head:
            keys[head.group(1)] = head.group(2).strip()
        n += 1
    missing = [k for k in REQUIRED if k not in keys]
    if missing:
        raise FiguresError(f"{path}: the header does not say its {', '.join(missing)} "
                           "(# command: / # kernel: / # date: lines)")
    try:
        keys.update(PARSERS[kind]("\n".join(lines[n:])))
    except (ValueError, KeyError) as e:
        raise FiguresError(f"{path}: not what its parser reads: {e}") from None
    return keys


def figure_value(spec, folder=FIGURES, cache=None):
    """The text for a role's content "FILE KEY"."""
    parts = spec.split()
    if len(parts) != 2:
        raise FiguresError(f"'{spec}': write :figure:`FILE KEY`, e.g. "
                           ":figure:`bench cpu0.readback_ns`")
    name, key = parts
    cache = {} if cache is None else cache
    if name not in cache:
        cache[name] = read_figures(name, folder)
    if key not in cache[name]:
        raise FiguresError(f"{name}.txt holds no '{key}' "
                           f"(it has: {', '.join(sorted(cache[name]))})")
    return cache[name][key]


_CACHE = {}


def figure_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    env = getattr(inliner.document.settings, "env", None)
    if env is not None and text.split():
        # Rebuild the page when its figures file changes.
        env.note_dependency(os.path.join(FIGURES, text.split()[0] + ".txt"))
    try:
        value = figure_value(text, cache=_CACHE)
    except FiguresError as e:
        msg = inliner.reporter.error(str(e), line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    return [nodes.inline(rawtext, value, classes=["mmiolab-figure"])], []


def _forget(app, env, docnames):
    # A figures file may have changed since the last build.
    _CACHE.clear()


def setup(app):
    app.add_role("figure", figure_role)
    app.connect("env-before-read-docs", _forget)
    return {"version": __version__, "parallel_read_safe": True}
