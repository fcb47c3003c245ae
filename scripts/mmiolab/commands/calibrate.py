"""Measure how fast this machine runs the lab guest, and say how long a
submission will take here (an autograder's image build runs it: Gradescope's
setup.sh, PrairieLearn's Dockerfile).

One short guest (speed.calibrate: a few seconds on the reference machine)
gives this machine's speed against the reference, and the CPUs a guest
really gets here (QEMU's CPU time over its wall time: the quota and other
load). For each lab: the time a submission should take here (lab.toml's
cpu_seconds, the CPU time its reference solution takes, over those CPUs;
a slower CPU than the one it was measured on is not counted) and the most
its guests may take (their ceilings, scaled by the CPU share as a graded
run's are). Against a platform's time limit for one submission (--platform
NAME: the kit's platform of that name, its Platform.budget: the default limit,
or MMIOLAB_TIME_LIMIT; --budget SECONDS: this one), a warning where a lab's
submission cannot fit: the instructor learns it now, from the image's build
log, not a student from a failed test.
"""

from __future__ import annotations

import argparse

from .. import labspec, speed
from ..config import Config
from ..platforms import PLATFORMS


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lab", action="append", choices=labspec.lab_names(),
                    help="this lab (repeatable; default: every lab)")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="the platform's time limit for one submission, in seconds "
                         "(default: --platform's, where it names one of the kit's)")
    ap.add_argument("--platform", default="the platform",
                    help=f"the grading platform ({', '.join(PLATFORMS)}: its time limit), "
                         "or a name for the warning")


def estimate(spec: labspec.LabSpec, smp: int, cal: speed.Calibration) -> tuple[float, float]:
    """(typical, most): a submission's seconds here, typical and at the ceilings
    (0 typical: the lab has no cpu_seconds)."""
    lim = spec.limits
    most = lim.build_timeout + lim.run_timeout * speed.slowdown(smp, lim.max_slowdown)
    if spec.hidden_smp:
        most += lim.run_timeout * speed.slowdown(spec.hidden_smp, lim.max_slowdown)
    return lim.cpu_seconds / max(cal.got_cpus, 0.01), most


def run(args: argparse.Namespace, cfg: Config) -> int:
    share, what = speed.cpu_share()
    cal = speed.calibrate(cfg)
    print(f"mmiolab: speed: {what} here; the calibration guest ({cal.smp} vCPUs) did its work "
          f"in {cal.work_seconds:.1f}s (the reference machine: "
          f"{speed.REFERENCE_WORK_SECONDS:.1f}s) after a {cal.boot_seconds:.1f}s boot: "
          f"{cal.factor:.1f}x the reference time (the guest got {cal.got_cpus:.2f} CPUs)",
          flush=True)
    named = PLATFORMS.get(args.platform)
    budget = args.budget or (named.budget(cfg) if named else 0.0)
    where = named.title if named else args.platform
    status = 0
    for name in args.lab or labspec.lab_names():
        spec = labspec.load_lab(name)
        typical, most = estimate(spec, cfg.smp, cal)
        said = f"about {typical:.0f}s" if typical else "an unknown time (no cpu_seconds)"
        print(f"mmiolab: speed: a {name} submission should take {said} here, "
              f"at most {most:.0f}s (its guests' time limits, scaled)", flush=True)
        if budget and typical and typical > budget:
            status = 1
            print(f"mmiolab: WARNING: {where}'s limit of {budget:.0f}s cannot fit "
                  f"a {name} submission here (about {typical:.0f}s): give its grading "
                  f"containers more CPU or a longer limit, or submissions will not be graded "
                  f"(results say the grading machine was too slow)", flush=True)
        elif budget and typical and most > budget:
            print(f"mmiolab: note: {where}'s limit of {budget:.0f}s fits a typical "
                  f"{name} submission, not one that uses all of its guests' time", flush=True)
    return status
