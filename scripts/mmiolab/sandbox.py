"""Run an untrusted step (a student module's build, its disassembly) confined.

The compiler reads whatever its input names (``#include "/etc/shadow"``,
``.incbin "../solutions/..."``) and prints parts of it in its diagnostics,
which go back to the student. So the build never sees the host: it runs in
bubblewrap with

- new user, pid, network, IPC, UTS (and, if possible, cgroup) namespaces,
  no way to make further user namespaces (bubblewrap's --disable-userns, or
  where bubblewrap is older than 0.8, as on Ubuntu 22.04, a seccomp filter
  that refuses them), a new session (no terminal);
- an unprivileged uid outside as well as inside: when the grader is root it
  drops to SANDBOX_UID first, because a mapped root is still kuid 0 to the
  host's files and is exempt from RLIMIT_NPROC;
- a read-only view of /usr (the toolchain; /usr/local hidden), the
  /etc/alternatives links the toolchain needs, and the paths the caller names
  (the kernel build tree); one writable folder, seen as /build; a minimal
  /dev; no /proc, /sys, /tmp, /home, /etc or kit;
- /dev/null as stdin, stdout and stderr into one file whose size is watched;
- limits on address space, CPU time, processes (counted per sandbox: the
  count lives in its own user namespace), file size, open files, core dumps;
- on a timeout or an output flood, the sandbox's pid 1 is killed, which
  kills every process of its pid namespace at once.

Where bubblewrap cannot work (a container under Docker's default seccomp
profile, which refuses new namespaces), the second level is the jail
(jail.py): chroot into a prepared tree, a uid of its own per concurrent
step, no_new_privs, a seccomp filter of the kit's own, Landlock where the
kernel offers it, the same limits, and every process of that uid killed at
the end. probe() says which level works (LEVELS, in that order;
Config.confine, MMIOLAB_CONFINE, forces one). Where neither does, the grader
stops unless the instructor allows an unconfined build; that runs the same
command with the same uid and limits in its own process group, and the
report says so.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import MmiolabError, jail
from .config import Config

BWRAP = "/usr/bin/bwrap"
PRLIMIT = "/usr/bin/prlimit"
INSIDE = "/build"                      # the writable folder, as the confined step sees it
PATH = "/usr/bin:/bin"
LEVELS = ("bubblewrap", "jail")        # tried in this order
UNCONFINED = "unconfined"              # the level's name when the instructor allowed none


class SandboxError(MmiolabError):
    """The sandbox could not be set up (not the step's own failure)."""


@dataclass(frozen=True)
class Limits:
    """One confined step's bounds. Its own type, not labspec.Limits: any step has
    them (objdump's, the tests'); a lab sets only its build's (labspec.Limits.build)."""
    timeout: float = 120.0             # wall clock, seconds
    cpu_seconds: int = 120             # per process
    memory: int = 1 << 30              # address space per process, bytes
    processes: int = 64                # in the sandbox at once
    file_bytes: int = 64 << 20         # largest file a process may write
    open_files: int = 256
    output_cap: int = 1 << 20          # bytes of stdout+stderr kept; more is a flood


@dataclass
class Result:
    status: str                        # ok | failed | timeout | flood
    returncode: int | None
    output: str = field(repr=False)    # at most output_cap bytes, decoded
    seconds: float
    confined: bool
    level: str = ""                    # LEVELS' name, or UNCONFINED

    def __str__(self) -> str:
        head = self.output[:400] + ("..." if len(self.output) > 400 else "")
        return f"{self.status} (status {self.returncode}, {self.seconds:.1f}s): {head}"


def ids(cfg: Config) -> tuple[int, int]:
    """The uid and gid a confined step runs as (Config.sandbox_uid/gid)."""
    return cfg.sandbox_uid, cfg.sandbox_gid


def _dropping() -> bool:
    return os.geteuid() == 0


def _usr_layout() -> list[str]:
    """/usr read-only, and /bin, /lib... as the host has them (links on merged-/usr)."""
    args = ["--ro-bind", "/usr", "/usr", "--tmpfs", "/usr/local"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + top
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if os.path.isdir("/etc/alternatives"):       # /usr/bin/awk -> /etc/alternatives/awk
        args += ["--ro-bind", "/etc/alternatives", "/etc/alternatives"]
    return args


def _has_disable_userns() -> bool:
    """Whether this bubblewrap has --disable-userns (0.8 and later)."""
    global _disable_userns
    if _disable_userns is None:
        try:
            res = subprocess.run([BWRAP, "--help"], capture_output=True, text=True, timeout=10)
            _disable_userns = "--disable-userns" in res.stdout + res.stderr
        except (OSError, subprocess.TimeoutExpired):
            _disable_userns = True          # the probe then says why bubblewrap fails
    return _disable_userns


_disable_userns: bool | None = None


def no_userns_filter() -> bytes:
    """A classic BPF seccomp program (bubblewrap's --seccomp input) that refuses
    new user namespaces: clone() and unshare() with CLONE_NEWUSER fail with
    EPERM (Flatpak's filter refuses clone() so, and unshare() altogether: the
    build needs neither); clone3(), whose flags a filter cannot read, fails
    with ENOSYS, as in Chromium's sandbox, so the C library falls back to
    clone(); x32 and i386 system calls fail with EPERM (they would bypass the
    numbers checked). The jail's filter (jail.jail_filter) refuses more."""
    return jail.seccomp_program([(jail.NR["clone3"], "deny", errno.ENOSYS),
                                 (jail.NR["clone"], "flags", jail.CLONE_NEWUSER, errno.EPERM),
                                 (jail.NR["unshare"], "flags", jail.CLONE_NEWUSER, errno.EPERM)])


def _filter_fd() -> int:
    """A pipe's read end holding no_userns_filter(), for --seccomp (or -1 where
    --disable-userns does the job). The caller passes it on and closes it."""
    if _has_disable_userns():
        return -1
    r, w = os.pipe()
    os.write(w, no_userns_filter())
    os.close(w)
    return r


def bwrap_args(writable: str, readonly: list[str], hide: Sequence[str] = (), *,
               cfg: Config, seccomp_fd: int = -1) -> list[str]:
    """The bubblewrap command line up to '--' (exposed for tests and the docs);
    seccomp_fd (from _filter_fd) stands in for --disable-userns."""
    uid, gid = ids(cfg)
    no_userns = ["--seccomp", str(seccomp_fd)] if seccomp_fd >= 0 else ["--disable-userns"]
    args = [BWRAP, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", *no_userns, "--die-with-parent",
            "--new-session", "--uid", str(uid), "--gid", str(gid),
            "--hostname", "mmiolab-build"]
    args += _usr_layout()
    for path in hide:                  # e.g. the kit, if it sits under /usr
        args += ["--tmpfs", path]
    for path in readonly:
        args += ["--ro-bind", path, path]
    args += ["--bind", writable, INSIDE, "--dev", "/dev", "--chdir", INSIDE, "--clearenv"]
    return args


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {"PATH": PATH, "HOME": INSIDE, "TMPDIR": INSIDE, "LC_ALL": "C", "LANG": "C"}
    env.update(extra)
    return env


def _prlimit(limits: Limits) -> list[str]:
    return [PRLIMIT, f"--as={limits.memory}", f"--cpu={limits.cpu_seconds}",
            f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}",
            f"--nofile={limits.open_files}", "--core=0", "--"]


def prepare(folder: str, cfg: Config) -> None:
    """Make `folder` the sandbox's writable folder: owned by the sandbox uid. Its
    parents must be searchable by that uid (bubblewrap runs as it): the caller
    makes its own folders 0711; the host's folders are never changed here."""
    if _dropping():
        uid, gid = ids(cfg)
        for top, dirs, files in os.walk(folder):
            for name in [top] + [os.path.join(top, n) for n in dirs + files]:
                os.lchown(name, uid, gid)


class Confinement(NamedTuple):
    """What probe() found: the level that works (LEVELS' name; "" when none
    does), and, in words for the instructor, what was tried before it and
    why that failed (for a jail that works, whether Landlock is part of it)."""
    level: str
    why: str


# (readonly, scratch, ids, confine, build, jail_uid, jail_gid): the probe's result
_probe_cache: dict[tuple[tuple[str, ...], str, tuple[int, int], str, str, int, int],
                   Confinement] = {}


def probe(readonly: list[str], scratch: str, cfg: Config) -> Confinement:
    """Which level can confine a step here that reads `readonly`: each of LEVELS
    in turn (or only Config.confine's), the first that works. Cached."""
    key = (tuple(readonly), scratch, ids(cfg), cfg.confine, cfg.build, cfg.jail_uid,
           cfg.jail_gid)
    if key not in _probe_cache:
        said = []
        found = ""
        for level in [cfg.confine] if cfg.confine else LEVELS:
            ok, why = (_probe_bwrap if level == "bubblewrap" else _probe_jail)(
                readonly, scratch, cfg)
            if why:
                said.append(f"{level}: {why}")
            if ok:
                found = level
                break
        _probe_cache[key] = Confinement(found, "\n".join(said))
    return _probe_cache[key]


def _probe_bwrap(readonly: list[str], scratch: str, cfg: Config) -> tuple[bool, str]:
    """Whether bubblewrap can run a step here that reads `readonly`; (ok, why not)."""
    uid, _ = ids(cfg)
    if not os.path.exists(BWRAP):
        return False, f"{BWRAP} is missing (Debian package bubblewrap; run 'make deps')"
    os.makedirs(scratch, exist_ok=True)
    tmp = os.path.join(scratch, f"probe-{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    os.chmod(scratch, 0o755)
    prepare(tmp, cfg)
    checks = " && ".join(f"test -r {p}" for p in readonly) or "true"
    fd = _filter_fd()
    cmd = bwrap_args(tmp, readonly, cfg=cfg, seccomp_fd=fd) + [
        "--setenv", "PATH", PATH, "--", "/bin/sh", "-c", checks]
    try:
        res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=30, pass_fds=(fd,) if fd >= 0 else (),
                             **_user_kw(cfg))
        ok = res.returncode == 0
        why = "" if ok else (res.stderr.strip() or
                             f"the sandbox cannot read {', '.join(readonly)} as uid "
                             f"{uid} (are its folders readable by others?)")
        private = _private_folder(list(readonly) + [scratch])
        if not ok and private:
            why += (f"\n{private} is private (other users cannot enter it), and the "
                    f"confined build runs as uid {uid}: keep the kit in a folder "
                    f"others can enter, e.g. /srv or /opt rather than /root, or "
                    f"chmod o+x {private}")
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, f"bubblewrap did not run: {e}"
    finally:
        if fd >= 0:
            os.close(fd)
        _rmtree(tmp)
    return ok, why


def _probe_jail(readonly: list[str], scratch: str, cfg: Config) -> tuple[bool, str]:
    """Whether the jail can run a step here that reads `readonly` (preparing
    its tree if need be); (ok, why not, or for a jail that works, what it
    has of Landlock)."""
    if not _dropping():
        return False, (f"the jail needs root (chroot, a uid of its own); the grader runs "
                       f"as uid {os.geteuid()}")
    os.makedirs(scratch, exist_ok=True)
    os.chmod(scratch, 0o755)
    tmp = os.path.join(scratch, f"probe-jail-{os.getpid()}")
    rw = os.path.join(tmp, "rw")
    os.makedirs(rw, exist_ok=True)
    checks = " && ".join([f"test -r {p}" for p in readonly] +
                         ["echo > /dev/null", f"touch {INSIDE}/probe"])
    try:
        res = run(["/bin/sh", "-c", checks], rw, readonly, os.path.join(tmp, "log"),
                  Limits(timeout=60), confined="jail", cfg=cfg)
        if res.status != "ok":
            return False, (f"a step in the jail failed ({res.status}, status "
                           f"{res.returncode}): {res.output.strip()[:400]}")
    except (OSError, SandboxError) as e:
        return False, str(e)
    finally:
        _rmtree(tmp)
    abi = _landlock_abi()
    return True, (f"Landlock ABI {abi}" if abi else
                  "no Landlock (the kernel or the container's seccomp profile refuses it)")


_landlock: list[int] = []


def _landlock_abi() -> int:
    if not _landlock:
        _landlock.append(jail.landlock_abi())
    return _landlock[0]


def resolve(confined: bool | str, readonly: list[str], cfg: Config) -> str:
    """The level a step given `confined` runs at: a level's name as it is;
    False or "" UNCONFINED; True the level probe() picks (SandboxError where
    none works)."""
    if isinstance(confined, str):
        return confined or UNCONFINED
    if not confined:
        return UNCONFINED
    found = probe(readonly, os.path.join(cfg.build, "scratch"), cfg)
    if not found.level:
        raise SandboxError(f"cannot confine the step here: {found.why}")
    return found.level


def _private_folder(paths: list[str]) -> str:
    """The first folder on the way to one of paths that others cannot enter, or ''."""
    for path in paths:
        parts = os.path.realpath(path).split(os.sep)
        for n in range(2, len(parts)):
            folder = os.sep.join(parts[:n])
            try:
                if not os.stat(folder).st_mode & 0o001:
                    return folder
            except OSError:
                return folder
    return ""


def _user_kw(cfg: Config) -> dict[str, Any]:
    if _dropping():
        uid, gid = ids(cfg)
        return {"user": uid, "group": gid, "extra_groups": []}
    return {}


def _rmtree(path: str) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def run(argv: list[str], writable: str, readonly: list[str], log: str, limits: Limits,
        env: dict[str, str] | None = None, confined: bool | str = True,
        hide: Sequence[str] = (), *, cfg: Config) -> Result:
    """Run argv with `writable` as its only writable folder (/build when confined).

    confined: a level's name (LEVELS), True for the level probe() picks, or
    False (or UNCONFINED) to run unconfined. stdout and stderr go to `log`
    (created here, outside `writable`); Result.output is its first
    limits.output_cap bytes. Never raises for what the step does.
    """
    level = resolve(confined, readonly, cfg)
    env = _env(env or {})
    if level == "jail":
        return _run_jail(argv, writable, readonly, log, limits, env, hide, cfg)
    confined = level == "bubblewrap"
    if not confined and level != UNCONFINED:
        raise SandboxError(f"no confinement level {level!r} (levels: {', '.join(LEVELS)})")
    info_r = info_w = filter_r = -1
    if confined:
        info_r, info_w = os.pipe()
        filter_r = _filter_fd()
        cmd = bwrap_args(writable, readonly, hide, cfg=cfg, seccomp_fd=filter_r) + ["--info-fd", str(info_w)]
        for k, v in env.items():
            cmd += ["--setenv", k, v]
        cmd += ["--"] + _prlimit(limits) + argv
        cwd = None
        run_env = None
    else:
        cmd = _prlimit(limits) + argv
        cwd = writable
        run_env = env
    t0 = time.monotonic()
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    cwd=cwd, env=run_env, start_new_session=True,
                                    pass_fds=tuple(fd for fd in (info_w, filter_r) if fd >= 0),
                                    **_user_kw(cfg))
        except OSError as e:
            raise SandboxError(f"cannot start {cmd[0]}: {e}") from e
        finally:
            for fd in (info_w, filter_r):
                if fd >= 0:
                    os.close(fd)
        child = _child_pid(info_r) if confined else None
        pidfd = _pidfd(child)
        status = _watch(proc, log, limits, t0, lambda: _kill(proc))
        rc = proc.returncode
        # bubblewrap reports the command's status as soon as the command exits, while
        # its pid 1 may still be taking the rest of the namespace down: wait for that.
        _end(pidfd)
    return _result(status, rc, log, limits, t0, level)


def _watch(proc: subprocess.Popen[bytes], log: str, limits: Limits, t0: float,
           kill: Callable[[], None]) -> str | None:
    """Wait for a step's first process, calling kill() at the time limit or when
    the log passes the output cap; "timeout", "flood" or None (it ended)."""
    while True:
        try:
            proc.wait(timeout=0.1)
            return None
        except subprocess.TimeoutExpired:
            pass
        status = None
        if time.monotonic() - t0 > limits.timeout:
            status = "timeout"
        elif os.path.getsize(log) > limits.output_cap:
            status = "flood"
        if status:
            kill()
            return status


def _result(status: str | None, rc: int | None, log: str, limits: Limits, t0: float,
            level: str) -> Result:
    seconds = time.monotonic() - t0
    with open(log, "rb") as f:
        output = f.read(limits.output_cap).decode("utf-8", "replace")
    if os.path.getsize(log) > limits.output_cap:
        status = "flood"                 # (the file-size limit may have ended it first)
    if status is None:
        status = "ok" if rc == 0 else "failed"
    return Result(status, rc, output, seconds, level != UNCONFINED, level)


def _run_jail(argv: list[str], writable: str, readonly: list[str], log: str, limits: Limits,
              env: dict[str, str], hide: Sequence[str], cfg: Config) -> Result:
    """run() at the jail level (jail.py): the tree prepared if need be, a slot
    taken, `writable` moved in as the slot's /build for the step and back
    after it, every process of the slot's uid killed at the end."""
    hidden = [p for p in list(hide) + [cfg.build] if p.startswith(("/usr/", "/etc/"))]
    try:
        jail.prepare_tree(cfg.build, readonly, hidden)
        slot = jail.acquire(cfg.build, cfg.jail_uid, cfg.jail_gid)
    except OSError as e:
        raise SandboxError(f"the jail cannot be set up: {e}") from e
    try:
        for p in readonly:
            if not os.path.exists(slot.root + os.path.realpath(p)):
                raise SandboxError(f"{p} is not in the jail's tree")
        _move(writable, slot.build)
        try:
            for top, dirs, files in os.walk(slot.build):
                for name in [top] + [os.path.join(top, n) for n in dirs + files]:
                    os.lchown(name, slot.uid, slot.gid)
            os.chmod(slot.build, 0o700)
            report_r, report_w = os.pipe()
            spec = {"root": slot.root, "uid": slot.uid, "gid": slot.gid, "env": env,
                    "argv": _prlimit(limits) + argv, "report": report_w,
                    "landlock": _landlock_abi(), "filter": jail.jail_filter().hex()}
            helper_env: dict[str, str] = {}       # the step's own is in spec
            t0 = time.monotonic()
            with open(log, "wb") as out:
                try:
                    proc = subprocess.Popen(jail.helper_argv(spec), stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=out, cwd="/", env=helper_env,
                                            start_new_session=True, pass_fds=(report_w,))
                except OSError as e:
                    raise SandboxError(f"cannot start the jail's helper: {e}") from e
                finally:
                    os.close(report_w)

                def kill() -> None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)   # the helper, before its exec
                    except ProcessLookupError:
                        pass
                    jail.kill_uid(slot.uid, slot.gid)
                    proc.wait()

                failed = _read_report(report_r)
                if failed:
                    kill()
                    raise SandboxError(f"the jail could not be set up: {failed}")
                status = _watch(proc, log, limits, t0, kill)
                rc = proc.returncode
            return _result(status, rc, log, limits, t0, "jail")
        finally:
            # Out of the jail only once nothing of the step lives: a process whose
            # working folder is moved out of a chroot can reach the whole tree
            # through ".." (chroot(2)).
            left = jail.kill_uid(slot.uid, slot.gid)
            if left:
                raise SandboxError(f"processes {left} of uid {slot.uid} outlived the step; "
                                   f"its folder stays in {slot.build}")
            _move(slot.build, writable)
            os.mkdir(slot.build, 0o755)
    finally:
        slot.release()


def _read_report(fd: int, timeout: float = 60) -> str:
    """What the jail's helper wrote on its report pipe: nothing when its exec
    succeeded (the pipe closes on exec), else why it could not set up."""
    data = b""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                return "the helper did not start in time"
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def _move(src: str, dest: str) -> None:
    """Move a folder (rename; across filesystems a copy, then the original removed)."""
    try:
        os.rename(src, dest)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        import shutil
        if os.path.isdir(dest):
            os.rmdir(dest)
        shutil.copytree(src, dest, symlinks=True)
        shutil.rmtree(src)


def _child_pid(fd: int) -> int | None:
    """The sandbox's pid 1, as bubblewrap reports it on --info-fd."""
    data = b""
    deadline = time.monotonic() + 10
    try:
        os.set_blocking(fd, False)
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not chunk:
                break
            data += chunk
            try:
                return int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                continue
    finally:
        os.close(fd)
    m = re.search(rb'"child-pid":\s*(\d+)', data)
    return int(m.group(1)) if m else None


def _pidfd(pid: int | None) -> int | None:
    """A handle on the sandbox's pid 1 that cannot come to name another process."""
    if pid is None:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:                   # already gone
        return None


def _end(pidfd: int | None, timeout: float = 10) -> None:
    """Kill the sandbox's pid 1 (a no-op if it has ended) and wait until it has: the
    kernel kills every other process of its pid namespace before pid 1 is done."""
    if pidfd is None:
        return
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.poll(timeout * 1000)
    os.close(pidfd)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill a step: bubblewrap's own process (its pid 1 dies with it, --die-with-parent,
    and _end() makes sure), or, unconfined, the process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
