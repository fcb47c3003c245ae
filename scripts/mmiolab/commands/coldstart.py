"""Cold start benchmark: a fresh clone, an empty ccache and an empty build
folder, then `make demo` and `make check`, timed phase by phase.

  scripts/coldstart [--dest DIR] [--no-check] [--keep]

(--keep, or any failure, keeps the clone, its build and its ccache.)

Clones the kit's last commit (uncommitted changes are not in it) into
DIR/kit (default: a new folder under build/), points CCACHE_DIR and
MMIOLAB_BUILD at empty folders inside DIR, runs `make deps`, `make demo` and
`make check` there with their output shown as it comes and logged in DIR,
and prints each phase in seconds (packages, unpack, configure, build,
initramfs, first boot, first grade, docs; then the debug kernel and the
suite) with the suite's ten slowest tests. The figures go to DIR/coldstart.json
and to build/coldstart.json, where `make demo` reads the last cold run
measured on this machine. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from .. import ROOT
from ..config import Config
from ..progress import phases, say, timed

TEST = re.compile(r"^(ok|FAIL|skip) +(\S+) \(([\d.]+)s\)$")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dest", help="where to clone and build (default: a new folder in build/)")
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="stop after make demo")
    ap.add_argument("--keep", action="store_true", help="keep the clone and its build")


def run(args: argparse.Namespace, cfg: Config) -> int:
    os.makedirs(cfg.build, exist_ok=True)
    dest = os.path.abspath(args.dest or tempfile.mkdtemp(prefix="coldstart-", dir=cfg.build))
    if os.path.exists(os.path.join(dest, "kit")):
        print(f"coldstart: {dest}/kit exists: give an empty --dest", file=sys.stderr)
        return 2
    kit = os.path.join(dest, "kit")
    env = {**os.environ, "CCACHE_DIR": os.path.join(dest, "ccache"),
           "MMIOLAB_BUILD": os.path.join(dest, "build")}
    for d in (env["CCACHE_DIR"], env["MMIOLAB_BUILD"]):
        os.makedirs(d, exist_ok=True)
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    say(f"coldstart: a fresh clone of {head} in {kit}, empty ccache and build folders; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    subprocess.run(["git", "clone", "-q", ROOT, kit], check=True)
    fig: dict[str, Any] = {"commit": head, "cpus": os.cpu_count(), "load_start": os.getloadavg()[0],
                 "when": time.strftime("%Y-%m-%d %H:%M"), "phases": {}}
    rc, sec, _ = timed(["make", "-s", "deps"], kit, env, os.path.join(dest, "deps.log"))
    fig["phases"]["packages"] = round(sec, 1)
    if rc:
        say("coldstart: make deps failed")
        return 1
    rc, sec, lines = timed(["make", "-s", "demo"], kit, env, os.path.join(dest, "demo.log"))
    fig["demo"] = {"seconds": round(sec, 1), "status": rc}
    fig["phases"].update({k: round(v, 1) for k, v in phases(lines).items()})
    fig["load_after_demo"] = os.getloadavg()[0]
    if rc:
        say("coldstart: make demo failed; make check runs all the same (its own figures), "
            "and the clone, its build and the logs are kept")
    if args.check:
        rc, sec, lines = timed(["make", "-s", "check"], kit, env, os.path.join(dest, "check.log"))
        fig["check"] = {"seconds": round(sec, 1), "status": rc}
        fig["phases"].update({k: round(v, 1) for k, v in phases(lines).items()
                              if k.startswith("debug")})
        tests = [(float(m.group(3)), m.group(2), m.group(1)) for m in map(TEST.match, lines) if m]
        fig["slowest"] = [{"test": t, "seconds": s, "result": w}
                          for s, t, w in sorted(tests, reverse=True)[:10]]
        took = next((ln for ln in lines if ln.startswith("suite took")), "")
        fig["check"]["suite"] = took.split()[-1] if took else "?"
        fig["check"]["result"] = next((ln for ln in reversed(lines) if " passed, " in ln), "?")
        fig["load_after_check"] = os.getloadavg()[0]
    print()
    say(f"coldstart of {head} ({fig['cpus']} CPUs; load average {fig['load_start']:.1f} "
        f"at the start):")
    for name, sec in fig["phases"].items():
        print(f"  {name:18} {sec:7.1f} s")
    print(f"  {'make demo':18} {fig['demo']['seconds']:7.1f} s (exit {fig['demo']['status']})")
    if "check" in fig:
        c = fig["check"]
        print(f"  {'make check':18} {c['seconds']:7.1f} s (exit {c['status']}; suite {c['suite']}; "
              f"{c['result']})")
        print("  the ten slowest tests:")
        for t in fig["slowest"]:
            print(f"    {t['seconds']:6.1f} s  {t['result']:4} {t['test']}")
    for path in (os.path.join(dest, "coldstart.json"), os.path.join(cfg.build, "coldstart.json")):
        with open(path, "w") as f:
            json.dump(fig, f, indent=1)
    say(f"coldstart: figures in {os.path.join(cfg.build, 'coldstart.json')}; logs in {dest}")
    ok = fig["demo"]["status"] == 0 and fig.get("check", {}).get("status", 0) == 0
    if not args.keep and ok:
        shutil.rmtree(kit, ignore_errors=True)
        shutil.rmtree(env["MMIOLAB_BUILD"], ignore_errors=True)
        shutil.rmtree(env["CCACHE_DIR"], ignore_errors=True)
    if not ok:
        say(f"coldstart: something failed: the clone and its build are kept in {dest}")
    return 0 if ok else 1
