"""Build a lab's driver and run the lab's guest tests on it.

One lab folder holds the starter (with the lab's Kbuild), the solutions, and
tests/: the guest harness (harness.sh) and the guest test programs (*.c,
built static). A run boots a fresh guest with the driver, the programs and
the harness in the initramfs overlay; the harness writes its KTAP to the
harness channel, each line prefixed with a per-run nonce.

The harness protocol, which every lab's harness.sh follows:
- the nonce is in /job/nonce, never on the kernel command line, in the job
  script or in an environment; the harness reads it into an unexported shell
  variable and deletes the file before it loads the driver, and its test
  programs print plain KTAP that the harness tags, so neither insmod nor a
  test program (the processes a driver runs in) holds it;
- the run is over when the harness prints END_LINE (tagged) on its channel,
  and only then (vm.VMConfig.done_marker): not when the guest stops.
A driver runs in ring 0 and can still find the nonce in the harness shell's
memory; Documentation/instructor/threat-model.rst says what that takes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

from . import BUILD, ROOT, kernel, ktap, vm
from .initramfs import compile_programs

LABS = os.path.join(ROOT, "labs")
END_LINE = "# mmiolab harness: end"


class BuildFailed(Exception):
    """The driver did not compile; the message is the compiler's output."""


@dataclass
class Lab:
    name: str
    module: str = "ringdrv"

    @property
    def dir(self) -> str:
        return os.path.join(LABS, self.name)

    @property
    def out(self) -> str:
        return os.path.join(BUILD, "labs", self.name)


@dataclass
class Build:
    ko: str
    warnings: list[str]
    log: str


@dataclass
class Run:
    seeds: list[int]
    nonce: str
    result: vm.RunResult
    append: list[str] = field(default_factory=list)


BUILD_MEMORY = 2 << 30       # address-space limit of one module build


def sandbox() -> list[str]:
    """A command prefix that cuts a build off the network: a new, empty network
    namespace (as root, or as a mapped root in a user namespace). Empty when
    neither works here, which the caller reports."""
    for prefix in (["unshare", "--net"], ["unshare", "--user", "--map-root-user", "--net"]):
        try:
            if subprocess.run(prefix + ["true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            pass
    return []


def build_driver(lab: Lab, source: str, workdir: str, timeout: float = 120) -> Build:
    """Compile one ringdrv.c with the lab's own Kbuild and headers (W=1)."""
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    shutil.copy(os.path.join(lab.dir, "starter", "Kbuild"), workdir)
    for name in os.listdir(lab.dir):
        if name.endswith(".h"):
            shutil.copy(os.path.join(lab.dir, name), workdir)
    shutil.copy(source, os.path.join(workdir, f"{lab.module}.c"))
    # No network and bounded memory; time is bounded below.
    cmd = sandbox() + ["prlimit", f"--as={BUILD_MEMORY}", "--",
                       "make", "-C", kernel.OBJ, f"M={workdir}", "W=1", "modules"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=kernel.build_env())
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"the build did not finish in {timeout:.0f}s")
    log = res.stdout + res.stderr
    with open(os.path.join(workdir, "build.log"), "w") as f:
        f.write(log)
    ko = os.path.join(workdir, f"{lab.module}.ko")
    if res.returncode or not os.path.exists(ko):
        errors = [line for line in log.splitlines() if "error" in line or "Error" in line]
        raise BuildFailed("\n".join(errors[:40]) or log[-4000:])
    warnings = [line for line in log.splitlines() if "warning:" in line]
    return Build(ko, warnings, log)


def guest_programs(lab: Lab) -> dict[str, str]:
    """Compile the lab's guest test programs (cached under build/labs/LAB/bin)."""
    headers = [os.path.join(lab.dir, h) for h in os.listdir(lab.dir) if h.endswith(".h")]
    return compile_programs(os.path.join(lab.dir, "tests"), os.path.join(lab.out, "bin"),
                            ["-pthread", f"-I{lab.dir}"], headers)


def run_tests(lab: Lab, ko: str, seeds: list[int], log_dir: str, cmds: int = 10000,
              append: list[str] | None = None, timeout: float = 90,
              console_cap: int = vm.VMConfig.console_cap) -> Run:
    """Boot a guest and run the lab's harness on the driver, once per seed."""
    nonce = ktap.make_nonce()
    files: dict[str, str | bytes] = {f"/job/{lab.module}.ko": ko,
                                     "/job/harness.sh": os.path.join(lab.dir, "tests", "harness.sh"),
                                     "/job/nonce": f"{nonce}\n".encode()}
    for name, path in guest_programs(lab).items():
        files[f"/job/{name}"] = path
    append = list(append or [])
    seed_list = " ".join(str(int(s)) for s in seeds)
    command = f"SEEDS='{seed_list}' CMDS={int(cmds)} sh /job/harness.sh"
    cfg = vm.VMConfig(append=append, timeout=timeout, console_cap=console_cap,
                      done_marker=f"{nonce} {END_LINE}")
    res = vm.run(command, files=files, cfg=cfg, log_dir=log_dir)
    if res.status != "exited" and res.boot_seconds is None:
        # The guest died before the harness started: nothing of the
        # submission had run. Seen under TCG as a rare int3 oops while
        # the boot patches a static key; boot once more before blaming
        # anyone, and keep the first console log.
        os.replace(res.log, res.log + ".boot-failure")
        res = vm.run(command, files=files, cfg=cfg, log_dir=log_dir)
    return Run(list(seeds), nonce, res, append)
