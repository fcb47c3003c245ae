"""`make demo`: build the kit and show it working, step by step, with nothing to type.

Kernel and initramfs (cached after the first run), a smoke boot of the lab
VM, the doorbell lab's starter graded (it must fail, and says why) and its
reference solution graded (it must pass), then the docs.
"""

import argparse
import json
import os
import subprocess
import time

from .. import ROOT, MmiolabError, initramfs, kernel, labspec, vm
from ..config import Config
from ..grade import GradeOptions, grade_one
from ..lab import confinement
from ..model import GradeResult
from ..progress import say, step

DOORBELL = os.path.join(ROOT, "labs", "doorbell")


def show(result: GradeResult, want_pass: bool, cfg: Config) -> bool:
    verdict = "PASS" if result.score == result.max_score else "FAIL"
    say(f"  {result.submission_id}: {result.score:g}/{result.max_score:g} -> {verdict} "
        f"(expected {'PASS' if want_pass else 'FAIL'})")
    if result.verdict != "graded":
        # Never ran in the guest (refused, or did not build): the reason is
        # the same for every test, so say it once.
        why = (result.notes or ["no reason recorded"])[0].strip().splitlines()
        say(f"    not graded ({result.verdict}): " + "\n      ".join(why[:12]))
    for t in result.tests:
        if result.verdict != "graded":
            break
        if t.score < t.max_score:
            lines = [line.strip() for line in t.output.splitlines() if line.strip()]
            first = next((line for line in lines if line.startswith("why:")), lines[0] if lines else "")
            say(f"    {t.name}: {t.score:g}/{t.max_score:g}  {first[:150]}")
    say(f"    details: {os.path.join(cfg.build, 'demo', result.submission_id, 'summary.txt')}")
    # The starter must fail in the guest, on its race: one that never got
    # there (did not build) shows nothing about the kit.
    return (verdict == "PASS") == want_pass and result.verdict == "graded"


# The demo after the kernel build (unpack, initramfs, boot, two grades, docs), measured
# with scripts/coldstart on a 2-CPU Debian 12 machine without KVM.
COLD_REST_SECONDS = 60


def cold_estimate(cfg: Config) -> str:
    """How long this run will take, roughly: the kernel build is most of a
    cold run, and its compiling divides among the CPUs."""
    t = kernel.tree(cfg)
    if kernel.is_built(t):
        return "the kernel is built: this run takes a few minutes at most"
    cpus = os.cpu_count() or 1
    build = t.cold_cpu_seconds / cpus
    msg = (f"the lab kernel is built first: about {t.cold_cpu_seconds // 60} CPU-minutes "
           f"of compiling with an empty ccache, about {build / 60:.0f} min on this machine's "
           f"{cpus} CPUs, and the whole demo about {(build + COLD_REST_SECONDS) / 60:.0f} min "
           f"(less where ccache already holds the objects)")
    try:
        with open(os.path.join(cfg.build, "coldstart.json")) as f:
            fig = json.load(f)
        msg += (f"; scripts/coldstart measured a cold demo of {fig['demo']['seconds'] / 60:.1f} "
                f"min here on {fig['when']}")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return msg


def add_arguments(ap: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, cfg: Config) -> int:
    t0 = time.monotonic()
    say(cold_estimate(cfg))
    try:
        kernel.build(t=kernel.tree(cfg))
        initramfs.build(cfg)
        with step("boot the lab VM and run a command in it"):
            res = vm.run("uname -r; cat /sys/kernel/debug/mmiosim/params",
                         cfg=vm.VMConfig.from_config(cfg, timeout=120))
            for line in res.console.splitlines():
                if line.startswith(("6.1", "profile=")):
                    print("    guest> " + line)
            say(res.describe())
            if not res.ok:
                return 1
        spec = labspec.load_lab("doorbell")
        confined, why = confinement(cfg)
        if not confined:
            say(f"cannot grade: the module builds cannot be confined here: {why}")
            return 1
        opts = GradeOptions(seeds=list(spec.default_seeds), out=os.path.join(cfg.build, "demo"),
                            cfg=cfg)
        ok = True
        with step("grade the doorbell lab's starter driver (must fail)"):
            r = grade_one(spec, os.path.join(DOORBELL, "starter", "ringdrv.c"), "starter", opts)
            ok &= show(r, want_pass=False, cfg=cfg)
        with step("grade the reference solution, mmiowb() before unlock (must pass)"):
            r = grade_one(spec, spec.solution_source("mmiowb", cfg), "solution-mmiowb", opts)
            ok &= show(r, want_pass=True, cfg=cfg)
        with step("build the docs"):
            subprocess.run(["make", "-s", "-C", ROOT, "docs"], check=True)
    except (MmiolabError, FileNotFoundError, subprocess.CalledProcessError) as e:
        say(f"error: {e}")
        return 1
    say(f"demo finished in {time.monotonic() - t0:.0f}s" + ("" if ok else " WITH UNEXPECTED RESULTS"))
    say(f"docs: file://{os.path.join(cfg.build, 'docs', 'html', 'index.html')}")
    say("labs: " + ", ".join(f"{n} (make -C labs/{n} check)" for n in labspec.lab_names()))
    say("next: 'make vm' for the interactive lab VM (leave with Ctrl-A X), "
        "'make check' for the test suite")
    return 0 if ok else 1
