"""Build a lab's driver and run the lab's guest tests on it (the lab: a
labspec.LabSpec, lab.toml's facts).

One lab folder holds the starter (with the lab's Kbuild), the solutions, and
tests/: the guest harness (harness.sh) and the guest test programs (*.c,
built static). A run boots a fresh guest with the driver, the programs and
the harness in the initramfs overlay; the harness writes its KTAP to the
harness channel, each line prefixed with a per-run nonce.

The harness protocol, which every lab's harness.sh follows by sourcing the
guest's harness library first (vm/harness-lib.sh, initramfs.HARNESS_LIB in
the guest), where its guest half is written once:
- the nonce is in /job/nonce, never on the kernel command line, in the job
  script or in an environment; the library reads it into an unexported shell
  variable and deletes the file before the harness loads the driver, and the
  test programs print plain KTAP that the harness tags, so neither insmod nor
  a test program (the processes a driver runs in) holds it;
- the run is over when the harness prints END_LINE (tagged) on its channel,
  and only then (vm.VMConfig.done_marker): not when the guest stops;
- until then it sends PROGRESS_LINE (tagged) once a second with how far the
  test programs got: the host tells a slow run from a stuck one by it
  (vm.Patience), and drops it before parsing (guestout.without_heartbeats).
A driver runs in ring 0 and can still find the nonce in the harness shell's
memory; Documentation/instructor/threat-model.rst says what that takes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from . import ROOT, MmiolabError, kernel, ktap, sandbox, vm
from .config import Config
from .initramfs import GUEST_SRC, compile_programs
from .labspec import LabSpec
from .submission import read_regular

END_LINE = "# mmiolab harness: end"
# The harness's heartbeat, once a second: PROGRESS_LINE and what the test
# programs last wrote to their progress file (vm/guest/progress.h).
PROGRESS_LINE = "# mmiolab progress"
PROGRESS_H = os.path.join(GUEST_SRC, "progress.h")
# The KTAP lines they print (ktap_out()).
KTAP_H = os.path.join(GUEST_SRC, "ktap.h")

#: Commands per CPU in a race run: the harnesses' CMDS (the doorbell and modern
#: labs' ringtest -n; their hidden runs derive theirs from it). The grader's,
#: and labstats' and the suite's for wrong fixes. A visible run is 2 CPUs times
#: this. What it must cover: the latest first failures of the wrong fixes that
#: fail last, with the labs' stalls at 4 writes in 100 (issue 35, 25 seeded
#: runs each, of 15,000 commands): at most 1,248 (doorbell) and 2,640 (modern)
#: on two CPUs, 5,136 (modern's mutex-mmiowb-after-unlock) at half a CPU, where
#: they fail latest (on four CPUs, hidden, 6,640 of 10,000: that run keeps
#: twice its share, 20,000); what it costs: nearly all of a correct
#: submission's CPU is its runs (make bench-grade). It was 10000, then 7500.
RACE_CMDS = 5000


class BuildFailed(MmiolabError):
    """The driver did not compile; the message is the compiler's output (no host paths)."""

    def __init__(self, message: str, reason: str = "failed"):
        super().__init__(message)
        self.reason = reason          # failed | timeout | memory | flood | objdump


@dataclass
class Build:
    ko: str
    warnings: list[str]
    log: str
    confined: bool | str = True      # the level that ran (sandbox.LEVELS), or False
    # About the system, not the submission (kernel.module_compiler): shown,
    # never charged.
    system_note: str = ""


@dataclass
class Run:
    seeds: list[int]
    nonce: str
    result: vm.RunResult
    append: list[str] = field(default_factory=list)


def kernel_tree(cfg: Config) -> list[str]:
    """What a module build may read besides the toolchain: the kernel build tree
    and its source, by their real paths (the build tree names its source by the
    path it was configured with, and the sandbox shows only what it binds).
    Resolved at each build, not at import: a cold `make demo` imports this
    before the kernel exists, when obj/source (a link to the source) is not
    there yet; bound by its own name, bubblewrap cannot mount over the link
    and every build failed."""
    t = kernel.tree(cfg)
    return sorted({os.path.realpath(t.obj), os.path.realpath(t.src),
                   os.path.realpath(os.path.join(t.obj, "source"))})


# The kernel's Kbuild makes no other environment matter (and gets none).
BUILD_ENV = {**{k: v for k, v in kernel.BUILD_ENV.items() if k.startswith("KBUILD_")},
             # Debian's kernel tree: no warning that only says the system's
             # compiler release is not the kernel's (kernel.CC_MISMATCH).
             "DEBIAN_KERNEL_NO_CC_VERSION_CHECK": "1"}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MAKE_ERROR = re.compile(r"make(\[\d+\])?: \*\*\* ")


def scratch_root(cfg: Config) -> str:
    """Where the grader makes its scratch folders (sandboxes: searchable by all)."""
    d = os.path.join(cfg.build, "scratch")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o755)
    return d


_OWNED = re.compile(r"[a-z]+-(\d+)-")


def new_scratch(prefix: str, cfg: Config) -> str:
    """A fresh scratch folder, named for this process ('grade-PID-...'), so that
    remove_stale_scratch() can tell one a killed grader left behind."""
    return tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=scratch_root(cfg))


def remove_stale_scratch(cfg: Config) -> list[str]:
    """Remove what graders that are gone (killed: no `finally` ran) left: the
    QEMU of a run they had in flight, with its files (vm.sweep_leftovers: by
    recorded pid, if that pid is still that QEMU), and their scratch folders,
    with the student files in them; the names removed and what was done. A
    folder whose process still runs (a parallel grader) is left alone."""
    gone = vm.sweep_leftovers(cfg.build)
    root = scratch_root(cfg)
    for name in sorted(os.listdir(root)):
        m = _OWNED.match(name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:         # alive, someone else's
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        gone.append(name)
    return gone


def confinement(cfg: Config) -> sandbox.Confinement:
    """Which level confines module builds here; (level, what was tried and why
    it failed): level is "" where none works (sandbox.probe)."""
    return sandbox.probe(kernel_tree(cfg), scratch_root(cfg), cfg)


def setup_confinement(cfg: Config) -> tuple[bool, str]:
    """For an autograder image's setup (Gradescope's setup.sh, the PrairieLearn
    Dockerfile), run as root while the image is built: the jail's tree
    prepared now, whichever level grading will pick (a container where
    bubblewrap fails then needs no minutes of copying per job), and which
    level confines module builds here; (a level works, words for the image's
    build log)."""
    said = []
    if os.geteuid() == 0:
        t0 = time.monotonic()
        jailed = sandbox.probe(kernel_tree(cfg), scratch_root(cfg),
                               dataclasses.replace(cfg, confine="jail"))
        said.append(f"mmiolab: the jail's tree is ready ({time.monotonic() - t0:.0f}s)"
                    if jailed.level else f"mmiolab: the jail cannot be used: {jailed.why}")
    found = confinement(cfg)
    if found.level:
        said.append(f"mmiolab: module builds are confined by {found.level}"
                    + (f" ({found.why})" if found.why else ""))
    else:
        said.append(f"mmiolab: WARNING: module builds cannot be confined in this image: "
                    f"{found.why}")
    return bool(found.level), "\n".join(said)


def confinement_level(confined: bool | str, cfg: Config) -> str:
    """The level a build given `confined` (build_driver's) runs at: a level's
    name, or sandbox.UNCONFINED."""
    if confined is True:
        found = confinement(cfg)
        if not found.level:
            raise sandbox.SandboxError(f"cannot confine the module builds here: {found.why}")
        return found.level
    return sandbox.resolve(confined, [], cfg)


def build_text(text: str, folder: str = "", source: str = "", named: str = "",
               *, cfg: Config) -> str:
    """Build output as a student may see it: no host paths, no colour codes, and
    the compiler's messages about `source` (ringdrv.c: ...) naming it `named`, as
    the student named it, when that is another name."""
    text = _ANSI.sub("", text)
    t = kernel.tree(cfg)
    hosts = [(folder, ""), (t.obj, "linux-build"), (t.src, "linux"),
             (cfg.build, "build"), (ROOT, "mmiolab")]
    hosts += [(os.path.realpath(p), shown) for p, shown in hosts[1:]]
    hosts = sorted(set(hosts), key=lambda p: -len(p[0]))
    for path, shown in hosts + [(sandbox.INSIDE, "")]:
        if not path:
            continue
        path = path.rstrip("/")
        edge = r"(?<![\w.-])" if path == sandbox.INSIDE else ""
        text = re.sub(edge + re.escape(path) + r"(/|\b)",
                      lambda m: (shown + "/" if shown else "") if m.group(1) else (shown or "."),
                      text)
    if source and named and named != source:
        text = re.sub(rf"(?<![\w./-]){re.escape(source)}(?=:)", lambda _: named, text)
    return text


def build_driver(lab: LabSpec, source: str, workdir: str, confined: bool | str = True,
                 named: str = "", *, cfg: Config) -> Build:
    """Compile one driver source with the lab's own Kbuild and headers (W=1), confined
    (sandbox.py: `confined` names the level, True the one that works here) within
    the lab's limits (Limits.build); the .ko, build.log and objdump.txt land in
    workdir. The log names the source `named` (its file name as the student gave
    it) if that is given."""
    level = confinement_level(confined, cfg)
    confined = level if level != sandbox.UNCONFINED else False
    t = kernel.tree(cfg)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    box = new_scratch("build", cfg)
    try:
        os.chmod(box, 0o711)
        src = os.path.join(box, "src")
        os.mkdir(src)
        shutil.copy(os.path.join(lab.dir, "starter", "Kbuild"), src)
        for name in os.listdir(lab.dir):
            if name.endswith(".h"):
                shutil.copy(os.path.join(lab.dir, name), src)
        shutil.copy(source, os.path.join(src, f"{lab.module}.c"))
        sandbox.prepare(src, cfg)
        where = sandbox.INSIDE if confined else src
        limits = lab.limits.build()
        cc = kernel.module_compiler(t.obj)
        res = sandbox.run(["make", "-C", os.path.realpath(t.obj), f"M={where}", "W=1",
                           f"CC={cc.cc}", "modules"], src, kernel_tree(cfg),
                          os.path.join(box, "build.log"), limits, env=BUILD_ENV,
                          confined=confined, hide=_hidden(), cfg=cfg)
        log = build_text(res.output, src, f"{lab.module}.c", named, cfg=cfg)
        with open(os.path.join(workdir, "build.log"), "w") as f:
            f.write(log)
        if res.status == "timeout":
            raise BuildFailed(f"the build did not finish in {limits.timeout:.0f}s", "timeout")
        if res.status == "flood":
            raise BuildFailed(f"the build printed more than {limits.output_cap} bytes; "
                              f"the first lines:\n" + "\n".join(log.splitlines()[:30]), "flood")
        ko = os.path.join(workdir, f"{lab.module}.ko")
        if res.status != "ok" or not _copy_regular(os.path.join(src, f"{lab.module}.ko"), ko):
            if "virtual memory exhausted" in log or "out of memory" in log.lower():
                raise BuildFailed(f"the build ran out of memory (each compiler process may "
                                  f"use {limits.memory >> 20} MiB)", "memory")
            # make's own "*** [...] Error 2" lines say only that something failed
            # (a tool Kbuild runs may fail without the word: "Can't locate ...").
            errors = [line for line in log.splitlines()
                      if "error" in line.lower() and not _MAKE_ERROR.match(line)]
            raise BuildFailed("\n".join(errors[:40]) if errors else
                              "\n".join(log.splitlines()[-40:]))
        warnings = [line for line in log.splitlines()
                    if "warning:" in line and line.strip() != kernel.CC_MISMATCH]
        note = cc.note
        if kernel.CC_MISMATCH in log and not note:
            note = (f"this system's {cc.cc} is not the exact release that built the lab kernel "
                    f"({cc.kernel}); Kbuild's warning about it is not counted")
        return Build(ko, warnings, log, confined, note)
    finally:
        shutil.rmtree(box, ignore_errors=True)


def _hidden() -> list[str]:
    """Kit folders the sandbox's view of /usr would otherwise show."""
    return [p for p in (ROOT,) if p.startswith(("/usr/", "/etc/"))]


def _copy_regular(src: str, dest: str, cap: int = 64 << 20) -> bool:
    """Copy a file the sandbox wrote, refusing links, special files and more than cap bytes."""
    try:
        data = read_regular(src, cap)
    except OSError:
        return False
    if data is None:
        return False
    with open(dest, "wb") as out:
        out.write(data)
    return True


def disassemble(ko: str, confined: bool | str = True, *, cfg: Config) -> str:
    """objdump -d -r of a module, itself confined: binutils reading a file a student
    shaped is one more parser to keep away from the host."""
    box = new_scratch("objdump", cfg)
    try:
        os.chmod(box, 0o711)
        src = os.path.join(box, "src")
        os.mkdir(src)
        shutil.copy(ko, os.path.join(src, "module.ko"))
        sandbox.prepare(src, cfg)
        where = sandbox.INSIDE if confined else src
        limits = sandbox.Limits(timeout=60, cpu_seconds=60, output_cap=64 << 20)
        res = sandbox.run(["objdump", "-d", "-r", "-w", "--no-show-raw-insn",
                           f"{where}/module.ko"], src, [], os.path.join(box, "objdump.txt"),
                          limits, confined=confined, hide=_hidden(), cfg=cfg)
        if res.status != "ok":
            raise BuildFailed(f"the module could not be disassembled ({res.status})",
                              "objdump")
        return res.output
    finally:
        shutil.rmtree(box, ignore_errors=True)


def guest_programs(lab: LabSpec, cfg: Config) -> dict[str, str]:
    """Compile the lab's guest test programs (cached under build/labs/LAB/bin)."""
    headers = [os.path.join(lab.dir, h) for h in os.listdir(lab.dir) if h.endswith(".h")]
    headers += [PROGRESS_H, KTAP_H]
    out = os.path.join(lab.out(cfg), "bin")
    return compile_programs(os.path.join(lab.dir, "tests"), out, kernel.tree(cfg).obj,
                            ["-pthread", f"-I{lab.dir}", f"-I{GUEST_SRC}"], headers)


def run_tests(lab: LabSpec, ko: str, seeds: list[int], log_dir: str, cmds: int = RACE_CMDS,
              append: list[str] | None = None, timeout: float = 90,
              console_cap: int = vm.VMConfig.console_cap, harness: str | None = None,
              smp: int | None = None, stall_timeout: float = 0.0,
              *, cfg: Config) -> Run:
    """Boot a guest and run the lab's harness (or another: the hidden tests')
    on the driver, once per seed. timeout is the run's ceiling; with a
    stall_timeout, a run whose harness sends no progress for so long is
    stuck (vm.Patience)."""
    nonce = ktap.make_nonce()
    harness = harness or lab.harness
    files: dict[str, str | bytes] = {f"/job/{lab.module}.ko": ko,
                                     "/job/harness.sh": harness,
                                     "/job/nonce": f"{nonce}\n".encode()}
    for name, path in guest_programs(lab, cfg).items():
        files[f"/job/{name}"] = path
    append = list(append or [])
    seed_list = " ".join(str(int(s)) for s in seeds)
    command = f"SEEDS='{seed_list}' CMDS={int(cmds)} sh /job/harness.sh"
    options = vm.VMConfig(append=vm.RECORD_APPEND + append, timeout=timeout,
                          console_cap=console_cap, done_marker=f"{nonce} {END_LINE}",
                          progress_marker=f"{nonce} {PROGRESS_LINE}",
                          stall_timeout=stall_timeout, smp=smp or 0, config=cfg)
    res = run_booted(command, files, options, log_dir)
    return Run(list(seeds), nonce, res, append)


def run_booted(command: str, files: dict[str, str | bytes], options: vm.VMConfig,
               log_dir: str) -> vm.RunResult:
    """vm.run, booted once more if the guest died before the job started:
    nothing of the submission had run. Seen under TCG as a rare int3 oops
    while the boot patched kernel text with the other vCPUs running (a
    static key, before the lab kernel dropped jump labels:
    vm/kernel.config); the first console log is kept beside the second."""
    res = vm.run(command, files=files, cfg=options, log_dir=log_dir)
    if res.status != "exited" and res.boot_seconds is None:
        os.replace(res.log, res.log + ".boot-failure")
        res = vm.run(command, files=files, cfg=options, log_dir=log_dir)
    return res
