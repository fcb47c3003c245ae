"""Run a lab's driver variants (starter, solutions, wrong-fix fixtures) over
many seeds and count how often the race test fails: the claims the labs make
("the starter fails in essentially every run, every solution passes") are
measured, not assumed."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass

from . import BUILD, ktap
from .lab import Lab, build_driver, run_tests


@dataclass
class Tally:
    variant: str
    runs: int
    failed: int
    first_failure: list[int]      # per failing run: submissions until the first failure
    throughput: list[float]
    seconds: float

    @property
    def median_first_failure(self) -> float | None:
        v = sorted(self.first_failure)
        return v[len(v) // 2] if v else None


def variant_source(lab: Lab, variant: str, workdir: str) -> str:
    """starter, solution:NAME or fixture:NAME (a patch applied to the starter)."""
    if variant == "starter":
        return os.path.join(lab.dir, "starter", "ringdrv.c")
    kind, name = variant.split(":", 1)
    if kind == "solution":
        return os.path.join(lab.dir, "solutions", name, "ringdrv.c")
    src = os.path.join(workdir, "ringdrv.c")
    with open(os.path.join(lab.dir, "starter", "ringdrv.c")) as f, open(src, "w") as g:
        g.write(f.read())
    subprocess.run(["patch", "-s", "-F0", "-p1", "-i",
                    os.path.join(lab.dir, "fixtures", f"{name}.patch")],
                   cwd=workdir, check=True, capture_output=True)
    return src


def race_runs(lab: Lab, variant: str, seeds: list[int], append: list[str] | None = None,
              cmds: int = 10000, timeout: float = 600) -> Tally:
    """Build the variant and run its race test once per seed, in one guest."""
    base = os.path.join(BUILD, "labtest", lab.name)
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        src = variant_source(lab, variant, tmp)
        built = build_driver(lab, src, os.path.join(tmp, "build"))
        log_dir = os.path.join(base, variant.replace(":", "-") + "-" + "-".join(append or ["default"]))
        run = run_tests(lab, built.ko, seeds, log_dir, cmds=cmds, append=append, timeout=timeout)
    parsed = ktap.parse(run.result.channel, nonce=run.nonce)
    race = parsed.root.find("race")
    runs = {t.name: t for t in (race.subtests if race else [])}
    failed, first, thr = 0, [], []
    for s in seeds:
        t = runs.get(f"seed_{s}")
        if t is None or not t.status.ok:
            failed += 1
        if t is not None:
            vals = t.values()
            if "first_failure_at" in vals:
                first.append(int(vals["first_failure_at"]))
            if "throughput_cps" in vals:
                thr.append(float(vals["throughput_cps"]))
    if run.result.status != "exited":
        raise RuntimeError(f"{variant}: {run.result.describe()}")
    return Tally(variant, len(seeds), failed, first, thr, run.result.seconds)
