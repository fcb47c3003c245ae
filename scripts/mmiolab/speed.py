"""How fast this machine runs the lab guest, against the machine the labs'
time limits were set on: the factor that scales a graded run's limits
(stages.run_guest), and what an autograder's image build reports (the
calibrate command, which Gradescope's setup.sh and PrairieLearn's Dockerfile
run).

Under TCG each vCPU is a host thread, so a guest of N busy vCPUs needs N host
CPUs to run at full speed. The labs' run_timeout were set on a machine with
REFERENCE_CPUS CPUs; a container given a share of one CPU (Gradescope's
default --cpus=0.5) runs a 2-vCPU guest four times slower, and a run that
fit in 60 s there needs about 240 s here. Two measures of that:

- the CPU share this process may use (cpu_share): its affinity and its cgroup's
  CPU quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us, the tightest on the path
  to the root), read when each run starts: what Docker's --cpus sets. This
  scales a graded run's limits (slowdown);
- a calibration (calibrate): a guest whose vCPUs all run the same fixed
  work, timed on the host, against the same work on the reference machine.
  It sees what the quota does not (a slower CPU, other load) but only at one
  moment: on a shared 2-CPU host under a load average of 18 it read 3.2 to
  6.3 times the reference in three runs a minute apart. So it is what an
  image build reports (the calibrate command, kept in build/vm/speed.json),
  and graded runs do not inherit it: a run slowed by load it did not see
  ends as "slow", which is not charged, and its stall limit stays short.

The factor only scales patience (vm.Patience): a run that makes no progress
is still stuck after the lab's stall limit, and a run that reaches its
scaled ceiling while progressing is "slow", never charged to the student.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass

from . import vm
from .config import Config

# The machine the labs' run_timeout were set on: 2 CPUs
# (x86-64, TCG). The calibration's work on it is an estimate, not an idle
# measurement: on 2026-12-07 the shared 2-CPU host never idled (load average
# 16 to 20), and three runs took 6.28, 3.23 and 3.78 s while the guest got
# 0.33, 0.42 and 0.34 CPUs (QEMU's CPU time over its wall time); scaled to
# the 2 CPUs it needs, 1.04, 0.68 and 0.64 s. Measure it again idle.
REFERENCE_CPUS = 2.0
REFERENCE_WORK_SECONDS = 0.7
# The calibration's work per vCPU: busybox awk's loop of this many rounds.
WORK_ROUNDS = 200000
CALIBRATION_SMP = 2


def _cgroup_quota(root: str = "/sys/fs/cgroup",
                  self_cgroup: str = "/proc/self/cgroup") -> float | None:
    """CPUs this process's cgroup may use (quota / period), the tightest on its
    path to the root; None if unlimited or unknown. Both hierarchies: v2
    (cpu.max "QUOTA PERIOD" or "max PERIOD") and v1 (the cpu controller's
    cpu.cfs_quota_us, -1 unlimited, and cpu.cfs_period_us)."""
    try:
        with open(self_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: float | None = None
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and controllers == "":
            base, files = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):
            base, files = os.path.join(root, controllers), ("cpu.cfs_quota_us",)
            if not os.path.isdir(base):
                base = os.path.join(root, "cpu")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            d = os.path.join(base, *parts[:depth])
            share = _quota_in(d, files[0])
            if share is not None:
                best = share if best is None else min(best, share)
    return best


def _quota_in(d: str, name: str) -> float | None:
    try:
        with open(os.path.join(d, name)) as f:
            text = f.read().split()
        if name == "cpu.max":
            quota, period = text[0], text[1]
        else:
            quota = text[0]
            with open(os.path.join(d, "cpu.cfs_period_us")) as f:
                period = f.read().split()[0]
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, IndexError, ValueError, ZeroDivisionError):
        return None


def cpu_share() -> tuple[float, str]:
    """CPUs this process may use, and what says so."""
    cpus = float(len(os.sched_getaffinity(0)))
    quota = _cgroup_quota()
    if quota is not None and quota < cpus:
        return quota, f"a CPU quota of {quota:g} CPUs (cgroup)"
    return cpus, f"{cpus:g} CPUs"


def _speed_file(cfg: Config) -> str:
    return os.path.join(cfg.build, "vm", "speed.json")


@dataclass
class Calibration:
    """One calibration: the guest's work in seconds, its boot, and the factor."""
    work_seconds: float
    boot_seconds: float
    smp: int
    factor: float               # work_seconds / REFERENCE_WORK_SECONDS
    share: float                # cpu_share() when it ran
    when: str
    # The CPUs the guest really got over the whole run: QEMU's CPU time / its
    # wall time (under other load, less than share).
    got_cpus: float = 0.0


def cached(cfg: Config) -> Calibration | None:
    """The last calibration on this machine, if any."""
    try:
        with open(_speed_file(cfg)) as f:
            return Calibration(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def calibrate(cfg: Config) -> Calibration:
    """Boot a guest of CALIBRATION_SMP vCPUs that runs WORK_ROUNDS of busybox
    awk on each at once, timed on the host; keep the result (cached()). A
    few seconds on the reference machine."""
    # Timed on the host, from the job's start (the console's "mmiolab:
    # running:") to QEMU's end: the guest's own clock jumped (172 s for a job
    # of 5) on a host starved by other load.
    job = (f"for c in $(seq 0 $(($(nproc) - 1))); do\n"
           f"  taskset -c $c awk 'BEGIN {{ for (i = 0; i < {WORK_ROUNDS}; i++) s += i * i }}' &\n"
           f"done\nwait")
    options = vm.VMConfig.from_config(cfg, smp=CALIBRATION_SMP, timeout=600)
    accel = vm.choose_accel(options)        # its KVM probe is no part of the figure
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = vm.run(job, cfg=options, accel=accel)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if not res.ok or res.boot_seconds is None:
        raise vm.VMError(f"the calibration guest failed: {res.describe()}")
    work = res.seconds - res.boot_seconds
    share, _ = cpu_share()
    cal = Calibration(round(work, 2), round(res.boot_seconds or 0.0, 2), CALIBRATION_SMP,
                      round(work / REFERENCE_WORK_SECONDS, 2), share,
                      time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      round(cpu / res.seconds, 2) if res.seconds else 0.0)
    path = _speed_file(cfg)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(asdict(cal), f)
    os.replace(tmp, path)
    return cal


def share_factor(smp: int, share: float) -> float:
    """How much slower a guest of smp busy vCPUs runs on `share` CPUs than on
    the reference machine."""
    return min(smp, REFERENCE_CPUS) / max(min(smp, share), 0.01)


def slowdown(smp: int, most: float) -> float:
    """The factor that scales a run's limits on this machine, for a guest of smp
    vCPUs: the CPU share's (share_factor), at least 1 and at most `most` (the
    lab's max_slowdown)."""
    share, _ = cpu_share()
    return max(1.0, min(most, share_factor(smp, share)))
