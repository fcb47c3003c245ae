"""Record the doorbell race (and its fixes) with the fabric's trace events.

For each driver below, boots a fresh lab guest with that driver built and
runs the lab's race test, one thread per CPU, under the guest's own `record`
helper (vm/record: the one students use), then keeps an excerpt as the docs'
recorded evidence (Documentation/figures/*-trace.txt, drawn by the docs'
mmiosim-timeline directive). Finding the moment and cutting the excerpt is
scripts/mmiolab/timeline.py's, as for the students' pictures:

  race          labs/doorbell/starter/ringdrv.c     around the first stale
                                                    doorbell: the two doorbell
                                                    writes that reordered
  fix-mmiowb    starter + solutions/mmiowb.patch    a lock hand-over between
  fix-readback  starter + solutions/readback.patch  CPUs, with the fix at work

The starter does not lose the race in every short run, so its test is run
again (recorded afresh, up to --tries times in the same boot) until it fails;
the excerpt says which attempt it was. record sets trace_clock "mono", the
clock of the events' t= fields under mmiosim.clock=real, so that a line's
timestamp is on the same scale (under clock=skip they run ahead of it:
timeline.model() says how the lines are placed). The full traces stay in
build/trace-timeline/NAME/trace.txt.

  /usr/bin/python3 scripts/trace-timeline [--only NAME ...] [--out DIR] [--cmds N]
                                          [--tries N] [--reuse] [--print-trace] [--svg]

Needs the lab kernel and initramfs (make kernel initramfs). Each run boots
the guest once (seconds under KVM, a little more under TCG).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys

from .. import ROOT, explore, kernel, timeline, vm
from ..config import Config
from ..lab import BuildFailed, build_driver, guest_programs
from ..labspec import load_lab

# name: (the doorbell lab's solution, or "" for the starter; what the excerpt shows)
VARIANTS = {
    "race": ("", "stale-doorbell"),
    "fix-mmiowb": ("mmiowb", "mmiowb"),
    "fix-readback": ("readback", "read"),
}
STARTER = "labs/doorbell/starter/ringdrv.c"
FIGURES = os.path.join(ROOT, "Documentation", "figures")

# Until the test fails (the race) or once (the fixes); each attempt is a
# recording of its own, so the one kept is the attempt reported. A failed
# run leaves the card and the driver disagreeing: reload between attempts.
GUEST = """
i=0
while [ $i -lt {tries} ]; do
	i=$((i + 1))
	insmod /job/ringdrv.ko || exit 11
	RECORD_KB=8192 record {test} > /dev/null 2>&1
	rc=$?
	rmmod ringdrv
	[ $rc -ne 0 ] && break
done
exit 0
"""


def driver(solution: str) -> str:
    """The driver as the recording's header names it."""
    return f"{STARTER} with labs/doorbell/solutions/{solution}.patch" if solution else STARTER


def record(name: str, solution: str, source: str, cmds: int, accel: str | None, tries: int,
           cfg: Config) -> tuple[str, dict[str, str]]:
    lab = load_lab("doorbell")
    work = os.path.join(cfg.build, "trace-timeline", name)
    os.makedirs(work, exist_ok=True)
    path = lab.solution_source(solution, cfg) if solution else lab.starter
    build = build_driver(lab, path, os.path.join(work, "module"), cfg=cfg)
    files: dict[str, str | bytes] = {"/job/ringdrv.ko": build.ko,
                                     "/job/driver": f"{source}\n".encode(),
                                     "/job/lab": b"doorbell\n"}
    for prog, path in guest_programs(lab, cfg).items():
        files[f"/job/{prog}"] = path
    test = f"/job/ringtest -k 1 -N race -n {cmds}"
    options = vm.VMConfig.from_config(cfg, timeout=180, accel=accel or "")
    log = os.path.join(work, "vm")
    res = vm.run(GUEST.format(tries=tries, test=test), files=files, cfg=options, log_dir=log)
    recs = explore.recordings(os.path.join(log, "channel.log"))
    if not res.ok or not recs or not recs[-1].text:
        why = recs[-1].problem if recs else "nothing was recorded"
        raise SystemExit(f"trace-timeline: {name}: the guest run failed: {res.describe()}; "
                         f"{why}\n" + res.console[-3000:])
    trace = recs[-1].text
    outputs = [ln[len("# output: "):].lstrip("# ").strip() for ln in trace.splitlines()
               if ln.startswith("# output: ")]
    summary = [r for r in outputs if "commands=" in r]
    verdict = [r for r in outputs if r.startswith(("ok ", "not ok "))]
    meta = {"result": "; ".join(summary[:1] + verdict[:1]) or "no result from ringtest",
            "attempt": f"{len(recs)} of at most {tries}", "accel": res.accel,
            "command": test}
    with open(os.path.join(work, "trace.txt"), "w") as f:
        f.write(trace)
    with open(os.path.join(work, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return trace, meta


def recorded(name: str, cfg: Config) -> tuple[str, dict[str, str]]:
    """The last recording of this driver (for --reuse)."""
    work = os.path.join(cfg.build, "trace-timeline", name)
    try:
        with open(os.path.join(work, "trace.txt")) as f:
            trace = f.read()
        with open(os.path.join(work, "meta.json")) as f:
            return trace, json.load(f)
    except OSError:
        raise SystemExit(f"trace-timeline: {name}: nothing recorded yet in {work}: "
                         "run without --reuse")


def excerpt(name: str, source: str, want: str, trace: str,
            meta: dict[str, str], ring: timeline.Ring) -> timeline.Drawing:
    header = {"mmiolab": "a recorded run of the lab kernel: an excerpt of "
                         "/sys/kernel/tracing/trace",
              "recorded_by": "/usr/bin/python3 scripts/trace-timeline (re-record with it)",
              "date": datetime.date.today().isoformat(), "driver": source, **meta}
    d = timeline.draw(trace, title=name, header=header, ring=ring)
    if d.finding is None or d.finding.kind != want:
        got = d.finding.text if d.finding else "nothing"
        if want == "stale-doorbell":
            raise SystemExit(
                f"trace-timeline: {name}: no doorbell arrived out of order in "
                f"{meta.get('attempt', 'this run')} attempts ({meta.get('result', '?')}); "
                "the race needs both virtual CPUs running at once, which a busy host (load "
                f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs) may not allow: "
                "run it again, perhaps with more --cmds or --tries")
        raise SystemExit(f"trace-timeline: {name}: the run shows no lock hand-over with "
                         f"{want} at work ({got}); run it again")
    return d


# What the docs' excerpts keep of the recording's header (the rest is the
# student's: the command's output, the card's counters, the modules loaded;
# fabric_lead_ns, under mmiosim.clock=skip, places the excerpt's interrupts).
DOCS_KEYS = ("mmiolab", "recorded_by", "date", "driver", "command", "kernel", "cpus", "accel",
             "fabric", "trace_clock", "result", "attempt", "shows", "excerpt", "fabric_lead_ns")


def docs_excerpt(d: timeline.Drawing) -> str:
    keep = []
    for line in d.excerpt.splitlines():
        m = re.match(r"# ([a-z_]+): ", line)
        if m and m.group(1) not in DOCS_KEYS:
            continue
        keep.append(line)
    head = {m.group(1): line for line in keep if (m := re.match(r"# ([a-z_]+): ", line))}
    body = [ln for ln in keep if not re.match(r"# ([a-z_]+): ", ln)]
    return "\n".join([head[k] for k in DOCS_KEYS if k in head] + body) + "\n"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", action="append", choices=sorted(VARIANTS),
                    help="record only this driver (repeatable)")
    ap.add_argument("--out", default=FIGURES, help="where the excerpts go (default: %(default)s)")
    ap.add_argument("--cmds", type=int, default=400, help="commands per thread (default 400)")
    ap.add_argument("--tries", type=int, default=10,
                    help="runs of the test in one boot until the starter fails (default 10)")
    ap.add_argument("--accel", choices=("auto", "kvm", "tcg"), default=None)
    ap.add_argument("--print-trace", action="store_true",
                    help="print each whole trace on stdout, not only its excerpt")
    ap.add_argument("--reuse", action="store_true",
                    help="cut the excerpt again from the last recording, without booting")
    ap.add_argument("--svg", action="store_true",
                    help="also draw each excerpt to build/trace-timeline/NAME/timeline.svg")


def run(args: argparse.Namespace, cfg: Config) -> int:
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or list(VARIANTS):
        solution, want = VARIANTS[name]
        source = driver(solution)
        print(f"trace-timeline: {name}: {source}", file=sys.stderr, flush=True)
        try:
            if args.reuse:
                trace, meta = recorded(name, cfg)
            else:
                trace, meta = record(name, solution, source, args.cmds, args.accel,
                                     args.tries if want == "stale-doorbell" else 1, cfg)
        except (BuildFailed, vm.VMError) as e:
            print(f"trace-timeline: {name}: {e}", file=sys.stderr)
            return 2
        if args.print_trace:
            sys.stdout.write(trace)
        d = excerpt(name, source, want, trace, meta, timeline.ring(kernel.tree(cfg).src))
        text = docs_excerpt(d)
        out = os.path.join(args.out, f"{name}-trace.txt")
        with open(out, "w") as f:
            f.write(text)
        if not args.print_trace:
            sys.stdout.write(text)
        if args.svg and d.svg:
            with open(os.path.join(cfg.build, "trace-timeline", name, "timeline.svg"), "w") as f:
                f.write(d.svg)
        print(f"trace-timeline: {name}: {meta.get('result', '?')}\n"
              f"trace-timeline: {name}: full trace {os.path.relpath(os.path.join(cfg.build, 'trace-timeline', name, 'trace.txt'), ROOT)}, "
              f"excerpt {os.path.relpath(out, ROOT)}", file=sys.stderr)
    return 0
