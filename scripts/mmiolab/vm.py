"""Launch the lab guest in QEMU: batch runs for tests and grading, or interactive.

A batch run boots the patched kernel with the base initramfs plus a per-run
overlay (the job script and its files), waits for the guest's exit status
(isa-debug-exit), and classifies the outcome: exited, panic, hang, flood,
no-status (the guest went down without reporting), unfinished or qemu-error.
The serial console is kept in a log; a second serial port (/dev/ttyS1 in the
guest) is the harness channel, kept apart from kernel messages.

A grading run names a done marker (VMConfig.done_marker): the harness's own
end line on the channel, carrying the run's nonce. Then the run is "exited"
only once that line has arrived, and the host stops the guest itself; a guest
that goes down any other way (isa-debug-exit, a reboot, a power-off: all
within reach of a driver) is "unfinished", whatever status it reported.

A grading run also tells slow from stuck (VMConfig.progress_marker,
stall_timeout): the harness sends a progress heartbeat, and any other tagged
line or trace data on the channel is progress too. A run that makes no
progress for stall_timeout seconds once the harness has started is stuck:
"hang". A run still making progress when its whole time (timeout, the
ceiling) runs out, and after, is "slow": the grading machine was too slow,
which says nothing about the driver. Progress only buys patience up to the ceiling; it
never decides a verdict.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import InitVar, dataclass, field
from typing import Any

from . import MmiolabError, bounded, initramfs, kernel
from .config import Config
from .initramfs import Archive, with_overlay

QEMU = "qemu-system-x86_64"
QBOOT = "/usr/share/qemu/qboot.rom"
DEBUG_EXIT = "isa-debug-exit,iobase=0xf4,iosize=0x04"
PANIC_MARK = "Kernel panic - not syncing"
# loglevel=5: the console shows KERN_WARNING and above, so a driver's WARN()
# reaches the console that clean_log scans (with loglevel=4 it never did).
BASE_APPEND = ["console=ttyS0", "panic=-1", "oops=panic", "panic_on_warn=0",
               "loglevel=5", "tsc=reliable", "no_timer_check"]
# The events vm/record traces, enabled at boot for the guests that record
# (graded runs, the lab VM), while only the boot CPU runs. Enabling an event
# rewrites kernel text (int3, then the jump); done in a running 2-CPU TCG
# guest, once in a suite run (2026-12-04) the other CPU then trapped on an
# int3 that was already gone and the kernel panicked: a correct driver
# graded as a crash. vm/init turns tracing off until record starts it.
RECORD_APPEND = ["trace_event=mmiosim:*,irq:irq_handler_entry,raw_syscalls:sys_exit"]


class VMError(MmiolabError):
    """The VM could not be started at all (no kernel, no QEMU)."""


@dataclass
class VMConfig:
    """One guest's options. What is left empty comes from the kit's Config:
    VMConfig.from_config(cfg, ...) passes the command's (VMConfig(config=cfg,
    ...) is the same); without one, every field must be given."""
    kernel: str = ""              # the config's kernel (kernel.tree(cfg))
    initrd: str = ""              # the base initramfs
    smp: int = 0                  # 2
    memory: str = ""              # 512M
    append: list[str] = field(default_factory=list)
    timeout: float = 120.0
    accel: str = ""               # auto | kvm | tcg
    console_cap: int = 4 << 20
    done_marker: str = ""         # a channel line that ends the run (grading)
    # Slow or stuck (grading): the heartbeat's tagged prefix ("NONCE # mmiolab
    # progress"), and the seconds without progress that make a run stuck (0:
    # no stall limit; the timeout alone ends it, as "hang").
    progress_marker: str = ""
    stall_timeout: float = 0.0
    build: str = ""               # where runs' logs and the KVM probe's verdict go
    monitor: str | None = None    # debugging: a QEMU monitor socket ("" none)
    config: InitVar[Config | None] = None

    def __post_init__(self, config: Config | None) -> None:
        if self.kernel and self.initrd and self.smp and self.memory and self.accel \
                and self.build and self.monitor is not None:
            return
        if config is None:
            raise TypeError("VMConfig: pass the kit's Config (VMConfig.from_config(cfg, ...)) "
                            "for the options left empty")
        cfg = config
        self.kernel = self.kernel or kernel.tree(cfg).bzimage
        self.initrd = self.initrd or initramfs.base(cfg)
        self.smp = self.smp or cfg.smp
        self.memory = self.memory or cfg.memory
        self.accel = self.accel or cfg.accel
        self.build = self.build or cfg.build
        self.monitor = cfg.qemu_monitor if self.monitor is None else self.monitor

    @classmethod
    def from_config(cls, cfg: Config, **options: Any) -> VMConfig:
        return cls(config=cfg, **options)


@dataclass
class RunResult:
    # exited | panic | hang | slow | flood | no-status | unfinished | qemu-error
    status: str
    exit_code: int | None       # the guest command's exit status, when it exited
    console: str
    channel: str
    seconds: float
    boot_seconds: float | None  # QEMU start to the job's first line
    accel: str
    log: str
    # The limits that applied (a "hang" or "slow" run: the one that ended it):
    # the whole run's (the ceiling), and no progress for so long (0: none).
    timeout: float = 0.0
    stall_timeout: float = 0.0
    beats: int = 0              # progress heartbeats seen

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.exit_code == 0

    @property
    def clock_ratio(self) -> float | None:
        """The guest's seconds per host second while its harness ran, at least:
        the harness's heartbeat sleeps a guest second between beats, so a guest
        whose clock keeps time sends at most one beat per host second. None
        for a run too short to tell. (Seen under host load: a guest whose
        clock ran four to six times fast, its drivers' timeouts firing early.)"""
        if self.boot_seconds is None:
            return None
        ran = self.seconds - self.boot_seconds
        if ran < 10 or self.beats < 5:
            return None
        return self.beats / ran

    def describe(self) -> str:
        hang = "the guest did not finish in time and was killed (hang)"
        if self.stall_timeout:
            hang = (f"the guest made no progress for {self.stall_timeout:.0f}s and was killed "
                    f"(hang: stuck, not slow)")
        what = {
            "exited": f"guest command exited with status {self.exit_code}",
            "panic": "the guest kernel panicked (oops or panic; see the console log)",
            "hang": hang,
            "slow": (f"the grading machine was too slow: the guest was still making progress "
                     f"when its {self.timeout:.0f}s ran out (not a fault of the driver)"),
            "flood": "the guest flooded the console and was stopped",
            "no-status": "the guest went down without reporting a status",
            "unfinished": "the guest went down before the harness said it had finished",
            "qemu-error": "QEMU failed to start",
        }[self.status]
        return f"{what} [{self.accel}, {self.seconds:.1f}s]"


_KVM_IOCTLS = r"""
import fcntl, os
fd = os.open("/dev/kvm", os.O_RDWR)
assert fcntl.ioctl(fd, 0xAE00) == 12          # KVM_GET_API_VERSION
vm = fcntl.ioctl(fd, 0xAE01, 0)               # KVM_CREATE_VM
cpu = fcntl.ioctl(vm, 0xAE41, 0)              # KVM_CREATE_VCPU
print("kvm ok")
"""


def _accel_file(cfg: VMConfig) -> str:
    return os.path.join(cfg.build, "vm", "accel.json")


def _probe_key(cfg: VMConfig) -> str:
    st = os.stat(cfg.kernel)
    return f"{os.uname().release}:{st.st_size}:{int(st.st_mtime)}:{shutil.which(QEMU)}"


def probe_kvm(cfg: VMConfig, timeout: float = 3.0) -> tuple[bool, str]:
    """Whether KVM really runs this guest; (verdict, reason).

    /dev/kvm can exist and answer ioctls, yet QEMU may abort on it or the
    guest hang (nested hosts): so after a bounded ioctl check, boot the real
    guest once under KVM with a short timeout. The verdict is cached in
    build/vm/accel.json for this kernel and host.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm missing or not accessible"
    key = _probe_key(cfg)
    cache = _accel_file(cfg)
    try:
        with open(cache) as f:
            cached = json.load(f)
        if cached.get("key") == key:
            return cached["kvm"], cached["reason"] + " (cached)"
    except (OSError, ValueError, KeyError):
        pass
    try:
        res = subprocess.run(["/usr/bin/python3", "-c", _KVM_IOCTLS], capture_output=True,
                             text=True, timeout=timeout)
        ok = res.returncode == 0 and "kvm ok" in res.stdout
        reason = "/dev/kvm ioctls work" if ok else "/dev/kvm ioctls fail"
    except subprocess.TimeoutExpired:
        ok, reason = False, f"/dev/kvm did not answer in {timeout:.0f}s"
    if ok:
        probe_cfg = VMConfig(kernel=cfg.kernel, initrd=cfg.initrd, smp=1, memory=cfg.memory,
                             accel="kvm", timeout=15, build=cfg.build, monitor=cfg.monitor)
        booted = run("true", cfg=probe_cfg, accel="kvm")
        ok = booted.ok
        reason = "a KVM guest booted" if ok else f"a KVM guest failed: {booted.status}"
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    tmp = f"{cache}.{os.getpid()}.tmp"      # test runs may probe at once
    with open(tmp, "w") as f:
        json.dump({"key": key, "kvm": ok, "reason": reason}, f)
    os.replace(tmp, cache)
    return ok, reason


_accel_cache: dict[str, str] = {}


def choose_accel(cfg: VMConfig) -> str:
    """cfg.accel if forced, else KVM when the probe passes, else TCG; says which."""
    if cfg.accel in ("kvm", "tcg"):
        return cfg.accel
    if "auto" not in _accel_cache:
        ok, reason = probe_kvm(cfg)
        _accel_cache["auto"] = "kvm" if ok else "tcg"
        print(f"mmiolab: vm: using {'KVM' if ok else 'TCG (-accel tcg,thread=multi)'}: {reason}",
              file=sys.stderr, flush=True)
    return _accel_cache["auto"]


def qemu_command(cfg: VMConfig, accel: str, initrd: str, append: list[str]) -> list[str]:
    for path, what in ((cfg.kernel, "kernel (run 'make kernel')"),
                       (initrd, "initramfs (run 'make initramfs')"), (QBOOT, "qboot firmware")):
        if not os.path.exists(path):
            raise VMError(f"missing {what}: {path}")
    if shutil.which(QEMU) is None:
        raise VMError(f"{QEMU} not found: run 'make deps' (package qemu-system-x86)")
    cmd = [QEMU, "-nodefaults", "-no-reboot", "-M", "pc", "-bios", QBOOT,
           "-smp", str(cfg.smp), "-m", cfg.memory,
           "-kernel", cfg.kernel, "-initrd", initrd,
           "-append", " ".join(BASE_APPEND + append),
           "-device", DEBUG_EXIT]
    if accel == "kvm":
        cmd += ["-accel", "kvm", "-cpu", "host"]
    else:
        cmd += ["-accel", "tcg,thread=multi", "-cpu", "max"]
    return cmd


def qemu_value(text: str) -> str:
    """text as the value of a QEMU option (path=..., logfile=...): QEMU's option
    parser ends a value at a comma, and reads a doubled comma as one."""
    return text.replace(",", ",,")


def run(command: str, files: dict[str, str | bytes] | None = None, *,
        cfg: VMConfig, log_dir: str | None = None,
        accel: str | None = None) -> RunResult:
    """Boot the guest, run `command` (a shell command line) in it, power off.

    files maps guest paths to host paths or bytes; they are added to the
    initramfs for this run only.
    """
    accel = accel or choose_accel(cfg)
    if log_dir is None:
        return _run_in(command, files, cfg, tempfile.mkdtemp(prefix="vm-", dir=_runs_dir(cfg)),
                       accel)
    with claim_dir(log_dir) as d:
        return _run_in(command, files, cfg, d, accel)


@contextlib.contextmanager
def claim_dir(path: str) -> Iterator[str]:
    """A log folder that is reused run after run, for this run alone: path, or
    path.2, path.3... when another process (a test suite running two modules
    at once) is using it. The result's log names the folder used."""
    n = 1
    while True:
        d = path if n == 1 else f"{path}.{n}"
        os.makedirs(d, exist_ok=True)
        fd = os.open(os.path.join(d, ".in-use"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            n += 1
            continue
        try:
            yield d
        finally:
            os.close(fd)
        return


def _run_in(command: str, files: dict[str, str | bytes] | None, cfg: VMConfig, log_dir: str,
            accel: str) -> RunResult:
    files = {"/job/run": ("#!/bin/sh\n" + command + "\n").encode(), **(files or {})}
    initrd = _overlaid(cfg.initrd, files, os.path.join(log_dir, "initrd.img"))
    append = cfg.append + ["run=/job/run"]
    try:
        res = _run_qemu(cfg, accel, initrd, append, log_dir)
    finally:
        os.unlink(initrd)
    return res


# ---------------------------------------------------------------------------- leftovers
#
# A batch QEMU dies with its grader, however the grader ends (issue 33: after
# `kill -9` of a grader, the OOM killer or a CI job killing one pid, a hung
# guest's QEMU ran on at full CPU, past its run limit, and its initrd.img
# stayed):
#
# - setpriv(1) --pdeathsig KILL execs QEMU with PR_SET_PDEATHSIG (prctl(2)):
#   the kernel kills QEMU when the thread that started it ends, the grader's
#   death included. A wrapper, not a preexec_fn: preexec_fn is not safe in a
#   process with threads (subprocess's documentation), and a batch grades in
#   threads. util-linux, which has setpriv, is Essential in Debian. A grader
#   killed before the prctl() is caught by a check of the parent after it
#   (bounded.dies_with_grader).
# - QEMU runs in its own process group (Popen's process_group=0), so it and
#   anything it starts are killed as one.
# - Each run is recorded (build/scratch/qemu/GRADER-QEMU.json: QEMU's pid, its
#   start time and command line, the files of the run) until it is reaped; the
#   stale-scratch sweep (sweep_leftovers, from lab.remove_stale_scratch) kills
#   the QEMU of a record whose grader is gone, if that pid still is that QEMU
#   (same start time, same command line: pids are reused), and removes its
#   files and the record.



def _records_dir(build: str) -> str:
    return os.path.join(build, "scratch", "qemu")


def _start_time(pid: int) -> str:
    """The process's start time (field 22 of /proc/PID/stat, in clock ticks since
    boot), which tells a process from a later one given the same pid; "" if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]     # fields after "(comm)" start at 3


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.fsdecode(f.read()).split("\0")[:-1]
    except OSError:
        return []


def _record(build: str, proc: subprocess.Popen[bytes], cmd: list[str], files: list[str]) -> str:
    d = _records_dir(build)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{os.getpid()}-{proc.pid}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"grader": os.getpid(), "pid": proc.pid, "start": _start_time(proc.pid),
                   "cmdline": cmd, "files": files}, f)
    os.replace(tmp, path)
    return path


def sweep_leftovers(build: str) -> list[str]:
    """Kill the QEMU of every run whose grader is gone, if that pid is still
    that QEMU, and remove the run's files and record; what it did, in words."""
    d = _records_dir(build)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return []
    done = []
    for name in names:
        path = os.path.join(d, name)
        try:
            with open(path) as f:
                rec = json.load(f)
            grader, pid = int(rec["grader"]), int(rec["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue                    # being written, or not ours: left alone
        try:
            os.kill(grader, 0)
            continue                    # its grader still runs (another batch)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        if _start_time(pid) == rec.get("start") and _cmdline(pid) == rec.get("cmdline"):
            try:
                os.killpg(pid, signal.SIGKILL)      # its own group: QEMU and its children
                done.append(f"killed QEMU {pid} of grader {grader}")
            except (ProcessLookupError, PermissionError):
                pass
        for leftover in rec.get("files", []):
            try:
                os.unlink(leftover)
                done.append(f"removed {leftover}")
            except OSError:
                pass
        try:
            os.unlink(path)
        except OSError:
            pass
    return done


def _overlaid(base: str, files: dict[str, str | bytes], out: str) -> str:
    """base + an overlay of files (guest path -> host path, or bytes: executable)."""
    overlay = Archive()
    for gpath, src in files.items():
        if isinstance(src, bytes):
            overlay.file(gpath, src, 0o755)
        else:
            overlay.host_file(gpath, src)
    return with_overlay(base, overlay, out)


def _runs_dir(cfg: VMConfig) -> str:
    d = os.path.join(cfg.build, "vm", "runs")
    os.makedirs(d, exist_ok=True)
    return d


def _batch_command(cfg: VMConfig, accel: str, initrd: str, append: list[str], log_dir: str,
                   channel_path: str, console_path: str) -> list[str]:
    """A batch run's QEMU command (the console on stdout, the channel to its
    file), kept in log_dir/qemu.cmd; clears the logs of an earlier run."""
    cmd = qemu_command(cfg, accel, initrd, append)
    for stale in (channel_path, console_path):      # a log folder may be reused
        if os.path.lexists(stale):
            os.unlink(stale)
    if cfg.monitor:                                 # debugging: a QMP/HMP socket
        cmd += ["-monitor", f"unix:{cfg.monitor},server,nowait"]
    cmd += ["-display", "none",
            "-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
            "-chardev", f"file,id=ch,path={qemu_value(channel_path)}",
            "-serial", "chardev:ch"]
    with open(os.path.join(log_dir, "qemu.cmd"), "w") as f:
        f.write(shlex.join(cmd) + "\n")
    return cmd


# Ctrl-C of a batch reaches only the grader's main thread: QEMU is in its own
# process group, out of the terminal's reach, and a batch's guests run in
# worker threads (grade.grade_batch). stop_guests() ends every QEMU this
# process runs and starts no more; each run it ended raises KeyboardInterrupt
# in its own thread, so no result is written for it.
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


class Stopped(KeyboardInterrupt):
    """A guest run ended by stop_guests() (the grader was interrupted)."""


def stop_guests() -> int:
    """Kill every QEMU this process runs (each its own process group) and
    start no more; returns how many were running."""
    with _LIVE_LOCK:
        _STOPPING.set()
        live = list(_LIVE)
    for proc in live:
        _kill_group(proc)
    return len(live)


def _run_qemu(cfg: VMConfig, accel: str, initrd: str, append: list[str],
              log_dir: str) -> RunResult:
    channel_path = os.path.join(log_dir, "channel.log")
    console_path = os.path.join(log_dir, "console.log")
    cmd = _batch_command(cfg, accel, initrd, append, log_dir, channel_path, console_path)
    t0 = time.monotonic()
    with _LIVE_LOCK:
        if _STOPPING.is_set():
            raise Stopped("the grader is stopping: no guest is started")
        proc = subprocess.Popen(bounded.dies_with_grader(cmd), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                process_group=0)
        _LIVE.add(proc)
    record = ""
    try:
        record = _record(cfg.build, proc, cmd, [initrd])
        console = _ConsoleReader(proc, console_path, cfg.console_cap, t0)
        done = _MarkerWatch(channel_path, cfg.done_marker)
        patience = Patience(cfg.progress_marker, cfg.stall_timeout, cfg.timeout, t0)
        status = _watch(proc, cfg, console, done, channel_path, t0, patience)
        rc, stderr = _reap(proc, console)
        if _STOPPING.is_set():
            raise Stopped("the grader is stopping: the guest was killed")
    except BaseException:
        # Ctrl-C in this thread, stop_guests(), or a grader bug: QEMU is in
        # its own group, out of the terminal's reach, so end it here.
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
        if record and proc.poll() is not None:
            os.unlink(record)
    seconds = time.monotonic() - t0
    text = console.text()
    if stderr.strip():
        with open(os.path.join(log_dir, "qemu.stderr"), "w") as f:
            f.write(stderr)
    exit_code = None
    if status is None:
        status, exit_code, text = _classify(cfg.done_marker, console.flood, done.seen(), rc,
                                                stderr, text)
    return RunResult(status, exit_code, text, _read_channel(channel_path, cfg.console_cap),
                     seconds, console.boot, accel, console_path, cfg.timeout,
                     patience.stall if status == "hang" else 0.0, patience.beats)


class _ConsoleReader:
    """A thread reading QEMU's stdout (the console) into memory and the console
    log, at most cap bytes: notes when the harness started (boot) and when a
    panic appeared; past cap it is a flood and it kills QEMU."""

    def __init__(self, proc: subprocess.Popen[bytes], path: str, cap: int, t0: float):
        self.proc = proc
        self.path = path
        self.cap = cap
        self.t0 = t0
        self.buf = bytearray()
        self.flood = False              # also set by _watch (the channel's flood)
        self.panic_at: float | None = None
        self.boot: float | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout
        buf = self.buf
        with open(self.path, "wb") as log:
            while True:
                # A pipe of bufsize -1 is a BufferedReader; typeshed says only IO.
                chunk = self.proc.stdout.read1(65536)  # type: ignore[attr-defined]
                if not chunk:
                    break
                if len(buf) + len(chunk) > self.cap:
                    chunk = chunk[:max(0, self.cap - len(buf))]
                    self.flood = True
                buf.extend(chunk)
                log.write(chunk)
                log.flush()
                if self.boot is None and b"mmiolab: running:" in buf:
                    self.boot = time.monotonic() - self.t0
                if self.panic_at is None and PANIC_MARK.encode() in buf:
                    self.panic_at = time.monotonic()
                if self.flood:
                    self.proc.kill()
                    break

    def text(self) -> str:
        return self.buf.decode(errors="replace")


class Patience:
    """Slow or stuck: what the channel says about a run's progress, and the
    verdict when a limit is reached (None while the run may go on).

    feed() takes what is new on the channel. Progress is a heartbeat
    ('MARKER VALUE') whose value changed, or any other line carrying the
    marker's nonce (the harness's own); a heartbeat with the same value only
    says the guest is alive, and untagged data (a trace vm/record sends)
    nothing: the harness's heartbeat goes on meanwhile. The stall clock starts when
    the harness starts (started()): a boot is bounded by the ceiling alone.
    With no marker or no stall limit, the ceiling is a "hang", as before."""

    def __init__(self, marker: str, stall: float, ceiling: float, t0: float):
        self.marker = marker.encode()
        self.tag = self.marker.split(b" ", 1)[0] + b" " if marker else b""
        self.stall = stall if marker else 0.0
        self.deadline = t0 + ceiling
        self.progress_at: float | None = None   # None: the harness has not started
        self.value: bytes | None = None
        self.beats = 0
        self.partial = b""

    def started(self, now: float) -> None:
        if self.progress_at is None:
            self.progress_at = now

    def feed(self, data: bytes, now: float) -> None:
        if not self.marker or not data:
            return
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()[-4096:]       # the rest of a long line is not a beat
        for line in lines:
            line = line.rstrip(b"\r")
            if not line.startswith(self.tag):
                continue
            if line.startswith(self.marker + b" "):
                self.beats += 1
                value = line[len(self.marker) + 1:]
                if value == self.value:
                    continue                     # alive, no further
                self.value = value
            self.started(now)
            self.progress_at = now

    def verdict(self, now: float) -> str | None:
        """"hang" (stuck: no progress for stall seconds; or the ceiling with
        no stall limit, or before the harness started), "slow" (progress
        seen after the ceiling), or None. At the ceiling a run waits for one
        or the other: progress just before it may have been the last (a
        driver stuck from then on, measured: a doorbell driver that stopped
        returning was called slow when the stall limit equalled the ceiling),
        so only progress after it says slow; the wait is at most the stall
        limit."""
        if self.stall and self.progress_at is not None and now - self.progress_at > self.stall:
            return "hang"
        if now > self.deadline:
            if not self.stall or self.progress_at is None:
                return "hang"
            if self.progress_at > self.deadline:
                return "slow"
        return None


class _ChannelTail:
    """What is new in a file (the harness channel) at each call."""

    def __init__(self, path: str):
        self.path = path
        self.pos = 0

    def read(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(1 << 20)
        except OSError:
            return b""
        self.pos += len(data)
        return data


def _watch(proc: subprocess.Popen[bytes], cfg: VMConfig, console: _ConsoleReader,
           done: _MarkerWatch, channel_path: str, t0: float,
           patience: Patience) -> str | None:
    """Wait for QEMU to end, or end it: at the done marker (returns None), at
    a limit (patience: "hang" stuck, "slow" at the ceiling while progressing),
    a panic QEMU outlives ("panic") or a flood of the channel (console.flood;
    returns None)."""
    status = None
    tail = _ChannelTail(channel_path)
    while proc.poll() is None:
        now = time.monotonic()
        if console.boot is not None:
            patience.started(t0 + console.boot)
        patience.feed(tail.read(), now)
        if done.seen():
            # The harness has finished: the run is over whatever the guest
            # does next. Its own exit path usually ends QEMU at once.
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
            break
        status = patience.verdict(now)
        if not status and console.panic_at is not None and now - console.panic_at > 5:
            status = "panic"     # panic=-1 should have ended QEMU already
        elif not status and os.path.exists(channel_path) and \
                os.path.getsize(channel_path) > cfg.console_cap:
            console.flood = True
        if status or console.flood:
            proc.kill()
            break
        time.sleep(0.05)
    return status


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """QEMU and anything it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(proc: subprocess.Popen[bytes], console: _ConsoleReader) -> tuple[int, str]:
    """QEMU's exit code and stderr, once it has ended; closes its pipes."""
    rc = proc.wait()
    console.thread.join(timeout=5)
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.stdout and not console.thread.is_alive():    # the reader is done with it
        proc.stdout.close()
    return rc, stderr


def _classify(marker: str, flood: bool, done: bool, rc: int, stderr: str,
              console: str) -> tuple[str, int | None, str]:
    """The status of a run QEMU ended by itself (or the flood ended): the status,
    the guest's exit code, and the console (with QEMU's error appended)."""
    if flood:
        return "flood", None, console
    if PANIC_MARK in console:
        return "panic", None, console
    if marker:                       # done: the marker came
        return ("exited", 0, console) if done else ("unfinished", None, console)
    if rc & 1 and f"mmiolab: exit status {rc >> 1}" in console:
        # isa-debug-exit: QEMU exits (status << 1) | 1; /init printed it too,
        # which tells a reported status from QEMU's own exit code 1 or 3.
        return "exited", rc >> 1, console
    if rc == 0:
        return "no-status", None, console
    return "qemu-error", None, console + f"\n[qemu exited {rc}: {stderr.strip()}]\n"


def _read_channel(path: str, cap: int) -> str:
    """The harness channel's first cap bytes ("" if the guest never wrote it)."""
    if not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        return f.read(cap).decode(errors="replace")


class _MarkerWatch:
    """Whether a file (the harness channel) has a line exactly equal to marker;
    reads only what is new at each call."""

    def __init__(self, path: str, marker: str):
        self.path = path
        self.marker = marker.encode()
        self.pos = 0
        self.partial = b""
        self.found = False

    def seen(self) -> bool:
        if not self.marker or self.found:
            return self.found
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(1 << 20)
        except OSError:
            return False
        self.pos += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        self.found = any(line.rstrip(b"\r") == self.marker for line in lines)
        if len(self.partial) > 4 * len(self.marker):
            # a line this long is not the marker: keep it so, but not in memory
            self.partial = b"\0" * (4 * len(self.marker))
        return self.found


def interactive(cfg: VMConfig, files: dict[str, str | bytes] | None = None,
                log_dir: str | None = None) -> int:
    """The lab VM on this terminal; Ctrl-A X leaves it. The console is logged to
    LOG_DIR/console.log; the guest's second serial port (/dev/ttyS1, where the
    guest's record helper sends its traces) to LOG_DIR/channel.log. files are
    added to the initramfs, as for run()."""
    accel = choose_accel(cfg)
    log_dir = log_dir or os.path.join(cfg.build, "vm")
    os.makedirs(log_dir, exist_ok=True)
    log = os.path.join(log_dir, "console.log")
    channel = os.path.join(log_dir, "channel.log")
    initrd = _overlaid(cfg.initrd, files, os.path.join(log_dir, "initrd.img")) if files \
        else cfg.initrd
    cmd = qemu_command(cfg, accel, initrd, cfg.append)
    cmd += ["-nographic",
            "-chardev", f"stdio,id=con,mux=on,signal=off,logfile={qemu_value(log)}",
            "-serial", "chardev:con",
            "-chardev", f"file,id=ch,path={qemu_value(channel)}", "-serial", "chardev:ch",
            "-mon", "chardev=con,mode=readline"]
    print(f"mmiolab: booting the lab VM ({accel.upper()}, {cfg.smp} CPUs); "
          f"leave with Ctrl-A X; console log in {log}", flush=True)
    try:
        return subprocess.call(cmd)
    finally:
        if initrd != cfg.initrd:
            os.unlink(initrd)
