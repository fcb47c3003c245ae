"""The second confinement level: a jail for the untrusted steps where
bubblewrap cannot work (sandbox.py has the first, and chooses).

A Gradescope or PrairieLearn grading job is a Docker container under
Docker's default seccomp profile, which refuses new namespaces to a
container without CAP_SYS_ADMIN: bubblewrap fails there ("No permissions to
create a new namespace"). What the container's root keeps is enough for a
jail with no namespaces and no mounts:

- a tree prepared once (prepare_tree): hard links, or copies where the
  filesystem refuses links, of /usr without /usr/local, the /bin, /lib...
  links, /etc/alternatives, the kernel build tree(s) at their own paths,
  five /dev nodes (mknod: CAP_MKNOD is in Docker's default set), and a
  /build folder. Nothing else: no /proc, /etc, /tmp, /home, kit, answers.
  One copy of it per slot (slot-N/, hard links to slot-0's files), because
  the writable folder must be /build in each and there are no mounts;
- a slot per concurrent step (Slot: an flock'ed lock file), each with its
  own uid and gid (Config.jail_uid + N), so that one build cannot signal or
  read another, and so that "every process of that uid" is exactly the
  step's processes: on a timeout, a flood or the step's end they are all
  killed with one kill(-1, SIGKILL) sent as that uid (a step that calls
  setsid() leaves its process group, not its uid);
- the step itself, started by the grader as a small helper it execs
  (/usr/bin/python3 -I -c ... this module's enter()), which, still root in a
  fresh single-threaded process: chroot()s into the slot, drops to the
  slot's uid and gid (setgroups([]), setgid, setuid), sets no_new_privs,
  adds Landlock rules where the kernel offers them (landlock_abi), installs
  the kit's seccomp filter (jail_filter) and execs the step under prlimit.
  The helper is exec'd rather than run as a preexec_fn because the batch
  grader forks from several threads: after fork() in a threaded process
  only async-signal-safe calls are safe, and Python code (chroot, ctypes,
  imports) is not; subprocess's own fork/exec path, which also does the
  new session and the close of every other descriptor, is.

What it protects and what it does not is in
Documentation/instructor/threat-model.rst.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

ROOT_INSIDE = "/build"            # the writable folder, as the step sees it (sandbox.INSIDE)
PY = "/usr/bin/python3"
SLOTS = 32                       # concurrent jailed steps at most (one uid each)
SETUP_FAILED = 125               # the helper's status when it could not set the jail up

# The device nodes a build uses, as bubblewrap's --dev makes them (null for
# Kbuild's redirections; the others for tools that read them).
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
           "urandom": (1, 9)}


# ---------------------------------------------------------------------------- seccomp

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
# Namespace flags of clone() (Docker's default profile refuses the same mask,
# 2114060288, to a container without CAP_SYS_ADMIN); unshare() and clone3()
# also take CLONE_NEWTIME (0x80), which in clone()'s flags is the exit signal.
CLONE_NS = 0x7E020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWTIME = 0x00000080
AF_UNIX = 1

# x86_64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
NR = {"socket": 41, "clone": 56, "ptrace": 101, "pivot_root": 155, "chroot": 161,
      "mount": 165, "umount2": 166, "kexec_load": 246, "add_key": 248, "request_key": 249,
      "keyctl": 250, "unshare": 272, "perf_event_open": 298, "name_to_handle_at": 303,
      "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
      "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
      "userfaultfd": 323, "init_module": 175, "delete_module": 176, "io_uring_setup": 425,
      "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
      "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
      "mount_setattr": 442}


# A seccomp_program() rule: (nr, "deny", errno) or (nr, "flags" | "arg0-not", value, errno).
SeccompRule = tuple[int, str, int] | tuple[int, str, int, int]


def seccomp_program(rules: list[SeccompRule]) -> bytes:
    """A classic BPF seccomp program for x86_64 (the layout of struct
    sock_filter): system calls of any other architecture, i386 and x32
    included (they would bypass the numbers checked), fail with EPERM; then
    each rule, in order; everything else is allowed. A rule is
    (nr, "deny", errno), (nr, "flags", mask, errno): refused when
    args[0] & mask, or (nr, "arg0-not", value, errno): refused unless
    args[0] == value (arguments: their low 32 bits)."""
    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06   # BPF_LD|W|ABS, BPF_JMP|..|K, BPF_RET|K
    allow, eperm = SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno.EPERM
    prog = [op(ld, 0, 0, 4),                       # seccomp_data.arch
            op(jeq, 1, 0, AUDIT_ARCH_X86_64),
            op(ret, 0, 0, eperm),
            op(ld, 0, 0, 0),                       # seccomp_data.nr
            op(jge, 0, 1, X32_SYSCALL_BIT),
            op(ret, 0, 0, eperm)]
    for nr, kind, *args in rules:
        refuse = op(ret, 0, 0, SECCOMP_RET_ERRNO | args[-1])
        if kind == "deny":
            block = [refuse]
        elif kind == "flags":
            block = [op(ld, 0, 0, 16), op(jset, 0, 1, args[0]), refuse, op(ret, 0, 0, allow)]
        elif kind == "arg0-not":
            block = [op(ld, 0, 0, 16), op(jeq, 1, 0, args[0]), refuse, op(ret, 0, 0, allow)]
        else:
            raise ValueError(f"seccomp rule {kind!r}")
        prog.append(op(jeq, 0, len(block), nr))
        prog += block
    prog.append(op(ret, 0, 0, allow))
    return b"".join(prog)


def jail_filter() -> bytes:
    """The jail's seccomp filter. Refused with EPERM: sockets other than
    AF_UNIX (the jail shares the container's network namespace: this rule is
    what keeps it off the network), ptrace and process_vm_readv/writev
    (Docker's default profile allows them on kernels from 4.8), new
    namespaces (clone() and unshare() with namespace flags, setns), mounts of
    either API, chroot, pivot_root, open_by_handle_at (handles reach files
    by number, not by path), keyrings, bpf, perf_event_open, userfaultfd,
    io_uring, kexec and module loading. clone3(), whose flags sit in memory
    a filter cannot read, fails with ENOSYS, as Docker's default profile and
    Chromium's sandbox do, so that the C library falls back to clone()."""
    deny = ["ptrace", "process_vm_readv", "process_vm_writev", "setns", "mount", "umount2",
            "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
            "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at",
            "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
            "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load",
            "kexec_file_load", "init_module", "finit_module", "delete_module"]
    rules: list[SeccompRule] = [(NR["clone3"], "deny", errno.ENOSYS),
                                (NR["clone"], "flags", CLONE_NS, errno.EPERM),
                                (NR["unshare"], "flags", CLONE_NS | CLONE_NEWTIME, errno.EPERM),
                                (NR["socket"], "arg0-not", AF_UNIX, errno.EPERM)]
    return seccomp_program(rules + [(NR[name], "deny", errno.EPERM) for name in deny])


# ---------------------------------------------------------------------------- Landlock

LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self = 444, 445, 446
# include/uapi/linux/landlock.h: the filesystem rights by ABI version.
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
FS_MAKE_CHAR, FS_MAKE_BLOCK = 1 << 6, 1 << 11
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1          # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


def _syscall() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none: a kernel
    without it, Landlock not among the active security modules, or a seccomp
    profile that refuses the call (Docker's default allows the landlock_*
    calls from Docker 20.10.18 and 23.0.0)."""
    libc = _syscall()
    v = libc.syscall(SYS_landlock_create_ruleset, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(v))


def _fs_rights(abi: int) -> int:
    return FS_RIGHTS[max(k for k in FS_RIGHTS if k <= abi)]


def landlock_restrict(writable: str, abi: int) -> str:
    """Restrict this process (and what it execs) with Landlock, where abi > 0:
    reading and executing anywhere, writing only beneath `writable` and to
    /dev/null, /dev/zero and /dev/full; with ABI 4, no TCP bind or connect;
    with ABI 6, no signal to, and no abstract UNIX socket of, a process
    outside the domain. The words for what was done, for the probe."""
    if abi <= 0:
        return "no Landlock"
    libc = _syscall()
    fs = _fs_rights(abi)
    attr = struct.pack("=Q", fs)
    said = [f"Landlock ABI {abi}: writes only in {writable}"]
    if abi >= 4:
        attr += struct.pack("=Q", NET_BIND_TCP | NET_CONNECT_TCP)
        said.append("no TCP")
    if abi >= 6:
        attr += struct.pack("=Q", SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
        said.append("signals and abstract sockets scoped")
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(SYS_landlock_create_ruleset, buf, ctypes.c_size_t(len(attr)),
                      ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        dev = FS_READ_FILE | FS_WRITE_FILE | ((FS_TRUNCATE | FS_IOCTL_DEV) & fs)
        rules = [("/", FS_EXECUTE | FS_READ_FILE | FS_READ_DIR),
                 (writable, fs & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK))]
        rules += [(f"/dev/{name}", dev) for name in ("null", "zero", "full")]
        rules += [(f"/dev/{name}", FS_READ_FILE | (FS_IOCTL_DEV & fs))
                  for name in ("random", "urandom")]
        for path, access in rules:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, pfd), 12)
                if libc.syscall(SYS_landlock_add_rule, ctypes.c_int(fd),
                                ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), rule,
                                ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(pfd)
        if libc.syscall(SYS_landlock_restrict_self, ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)
    return ", ".join(said)


# ---------------------------------------------------------------------------- the helper

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
PR_SET_PDEATHSIG = 1


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(program: bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def enter() -> None:
    """The helper's body (python3 -I -c '... jail.enter()' SPEC): set the jail
    up around this process, then exec the step. SPEC (JSON): root, uid, gid,
    argv, env, report (a descriptor: empty at a successful exec, else why the
    jail could not be set up). Runs as root in a fresh, single-threaded
    process in its own session, with only 0, 1, 2 and `report` open."""
    grader = os.getppid()
    spec = json.loads(sys.argv[1])
    report = spec["report"]
    step = "start"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        program = bytes.fromhex(spec["filter"])
        step = "chroot"
        os.chroot(spec["root"])
        os.chdir(ROOT_INSIDE)
        step = "drop to the jail's uid"
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        if os.getuid() != spec["uid"] or os.geteuid() != spec["uid"] or os.getgroups():
            raise OSError(errno.EPERM, "the uid did not change")
        step = "no_new_privs"
        # After the uid change: a change of credentials clears the parent-death
        # signal. A grader that died before it was set sends none: check.
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != grader:
            os._exit(137)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        step = "Landlock"
        landlock_restrict(ROOT_INSIDE, spec["landlock"])
        step = "seccomp"
        _install_seccomp(program)
        step = "exec " + spec["argv"][0]
        os.set_inheritable(report, False)
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as e:
        os.write(report, f"{step}: {e}".encode())
        os._exit(SETUP_FAILED)


def helper_argv(spec: dict[str, object]) -> list[str]:
    """The command line that runs enter() with `spec` (mmiolab from this kit)."""
    scripts = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {scripts!r}); from mmiolab import jail; jail.enter()"
    return [PY, "-I", "-S", "-c", code, json.dumps(spec)]


# ---------------------------------------------------------------------------- the tree

def _stamp(sources: list[str]) -> dict[str, object]:
    """What the tree was made from: the paths, and what tells a changed one
    (the package database for /usr; a rebuilt kernel's key files): their
    size and modification time in whole seconds. Not the inode, nor the
    nanoseconds: a container of an image sees its files with other inode
    numbers than the build that made the tree, and an image's layers keep
    whole seconds, so either would remake the tree in every grading job."""
    sig = {}
    for path in ["/var/lib/dpkg/status", "/usr"] + [
            os.path.join(s, name) for s in sources
            for name in ("", "Makefile", ".config", "Module.symvers",
                         "include/generated/utsrelease.h")]:
        try:
            st = os.stat(path)
            sig[path] = [int(st.st_mtime), st.st_size]
        except OSError:
            pass
    return {"sources": sources, "signature": sig}


def _link_or_copy(src: str, dest: str) -> str:
    """Copy src (a folder, file or link) to dest with hard links (cp -al),
    else as a copy (cp -a: another filesystem, or one that refuses links);
    which one it was."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    res = subprocess.run(["cp", "-al", "--", src, dest], capture_output=True, text=True)
    if res.returncode == 0:
        return "hard links"
    shutil.rmtree(dest, ignore_errors=True)
    res = subprocess.run(["cp", "-a", "--", src, dest], capture_output=True, text=True)
    if res.returncode != 0:
        raise OSError(f"cannot copy {src} into the jail: {res.stderr.strip()}")
    return "a copy"


def _excluded(path: str, hidden: list[str]) -> bool:
    return any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden)


def _fill(root: str, sources: list[str], hidden: list[str]) -> dict[str, str]:
    """Make the jail's tree under root (see the module's docstring); for each
    part, how it was made."""
    how = {}
    os.makedirs(os.path.join(root, "usr", "local"))
    for name in sorted(os.listdir("/usr")):
        src = os.path.join("/usr", name)
        if name == "local" or _excluded(src, hidden):
            continue
        how[src] = _link_or_copy(src, os.path.join(root, "usr", name))
    for path in hidden:                       # the kit or its build/, if under /usr
        shutil.rmtree(root + path, ignore_errors=True)
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + top
        if os.path.islink(path):
            os.symlink(os.readlink(path), os.path.join(root, top))
        elif os.path.isdir(path):
            how[path] = _link_or_copy(path, os.path.join(root, top))
    if os.path.isdir("/etc/alternatives"):    # /usr/bin/awk -> /etc/alternatives/awk
        how["/etc/alternatives"] = _link_or_copy("/etc/alternatives",
                                                 os.path.join(root, "etc", "alternatives"))
    for src in sources:                       # the kernel trees, at their own paths
        if os.path.lexists(root + src):
            continue
        how[src] = _link_or_copy(src, root + src)
    dev = os.path.join(root, "dev")
    os.makedirs(dev)
    for name, (major, minor) in DEVICES.items():
        os.mknod(os.path.join(dev, name), stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(os.path.join(dev, name), 0o666)
    os.mkdir(os.path.join(root, ROOT_INSIDE.lstrip("/")), 0o755)
    return how


@dataclass
class Tree:
    """The prepared jail: where, what it was made of, how, and how long it took."""
    path: str
    how: dict[str, str]
    seconds: float
    fresh: bool                       # made by this call


def jail_dir(build: str) -> str:
    return os.path.join(build, "jail")


def prepare_tree(build: str, sources: list[str], hidden: Sequence[str] = ()) -> Tree:
    """The jail's tree under build/jail (slot-0/, the tree; a slot's copy is
    made when the slot is first used), made now unless it exists, holds
    `sources` (the kernel trees) and nothing it was made of has changed since
    (_stamp). A new tree holds the old one's sources as well, while they
    exist (the debug kernel's tree beside the other). Needs root. Raises
    OSError with the reason when it cannot be made (e.g. mknod refused)."""
    sources = sorted({os.path.realpath(s) for s in sources})
    top = jail_dir(build)
    os.makedirs(top, exist_ok=True)
    os.chmod(top, 0o711)
    stamp_path = os.path.join(top, "stamp.json")

    def current() -> tuple[Tree | None, list[str]]:
        try:
            with open(stamp_path) as f:
                old = json.load(f)
        except (OSError, ValueError):
            return None, []
        have = old.get("sources", [])
        if _stamp(have) == {k: old.get(k) for k in ("sources", "signature")}:
            if set(sources) <= set(have):
                return Tree(top, old.get("how", {}), old.get("seconds", 0.0), False), have
            return None, have
        return None, []

    with _locked(os.path.join(top, "tree.lock"), fcntl.LOCK_SH):
        tree, _ = current()
    if tree:
        return tree
    with _locked(os.path.join(top, "tree.lock"), fcntl.LOCK_EX):
        tree, have = current()
        if tree:
            return tree
        sources = sorted(set(sources) | {s for s in have if os.path.exists(s)})
        t0 = time.monotonic()
        if os.path.exists(stamp_path):
            os.unlink(stamp_path)
        for name in os.listdir(top):          # an older tree and its slots
            if name.startswith("slot-") and not name.endswith(".lock"):
                shutil.rmtree(os.path.join(top, name))
        tmp = os.path.join(top, "slot-0.new")
        os.mkdir(tmp, 0o755)
        try:
            how = _fill(tmp, sources, list(hidden))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        os.rename(tmp, os.path.join(top, "slot-0"))
        seconds = time.monotonic() - t0
        with open(stamp_path + ".new", "w") as f:
            json.dump({**_stamp(sources), "how": how, "seconds": seconds}, f, indent=1)
        os.rename(stamp_path + ".new", stamp_path)
        return Tree(top, how, seconds, True)


class _locked:
    """flock() on a lock file, as a context manager (blocking, or not: then
    BlockingIOError)."""

    def __init__(self, path: str, how: int):
        self.path, self.how = path, how

    def __enter__(self) -> _locked:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, self.how)
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)              # (closing the descriptor releases the lock)


# ---------------------------------------------------------------------------- slots

@dataclass
class Slot:
    """One jailed step's place: its root (slot-N/), its ids, its lock."""
    n: int
    root: str
    uid: int
    gid: int
    lock: _locked
    tree_lock: _locked

    @property
    def build(self) -> str:
        return os.path.join(self.root, ROOT_INSIDE.lstrip("/"))

    def release(self) -> None:
        self.lock.__exit__(None, None, None)
        self.tree_lock.__exit__(None, None, None)


def acquire(build: str, base_uid: int, base_gid: int, timeout: float = 600) -> Slot:
    """A free slot (waiting up to `timeout` seconds for one), with its root made
    (slot-0's files hard-linked) and nothing of its uid still running: any
    process of that uid is a leftover of a grader that was killed, and is
    killed now. The tree stays as it is while a slot is held (a shared lock)."""
    top = jail_dir(build)
    tree_lock = _locked(os.path.join(top, "tree.lock"), fcntl.LOCK_SH).__enter__()
    try:
        if not os.path.isdir(os.path.join(top, "slot-0")):
            raise OSError(errno.ENOENT, "the jail's tree is not prepared", top)
        deadline = time.monotonic() + timeout
        while True:
            for n in range(SLOTS):
                lock = _locked(os.path.join(top, f"slot-{n}.lock"),
                               fcntl.LOCK_EX | fcntl.LOCK_NB)
                try:
                    lock.__enter__()
                except BlockingIOError:
                    continue
                try:
                    slot = Slot(n, os.path.join(top, f"slot-{n}"), base_uid + n,
                                base_gid + n, lock, tree_lock)
                    _make_slot(top, slot)
                    left = kill_uid(slot.uid, slot.gid)
                    if left:
                        raise OSError(errno.EBUSY, f"processes {left} of the jail's uid "
                                      f"{slot.uid} cannot be killed")
                    # Empty (a step whose processes outlived it left its folder there).
                    shutil.rmtree(slot.build, ignore_errors=True)
                    os.mkdir(slot.build, 0o755)
                    return slot
                except BaseException:
                    lock.__exit__(None, None, None)
                    raise
            if time.monotonic() > deadline:
                raise OSError(errno.EBUSY, f"all {SLOTS} jail slots are busy")
            time.sleep(0.5)
    except BaseException:
        tree_lock.__exit__(None, None, None)
        raise


def _make_slot(top: str, slot: Slot) -> None:
    """slot-N/ for N > 0: slot-0's tree, hard-linked (the same filesystem), with
    its own empty /build."""
    if os.path.isdir(slot.root):
        return
    tmp = slot.root + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o755)
    base = os.path.join(top, "slot-0")
    for name in os.listdir(base):
        if name == ROOT_INSIDE.lstrip("/"):
            os.mkdir(os.path.join(tmp, name), 0o755)
        else:
            _link_or_copy(os.path.join(base, name), os.path.join(tmp, name))
    os.rename(tmp, slot.root)


def processes_of(uid: int) -> list[int]:
    """The live pids whose real, effective or saved uid is uid (from /proc);
    zombies, which can do nothing more and wait for their parent, are not."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        state = fields.get("State", "").split()
        if str(uid) in fields.get("Uid", "").split()[:3] and state and state[0] not in "ZX":
            out.append(int(entry))
    return out


def kill_uid(uid: int, gid: int, timeout: float = 10) -> list[int]:
    """Kill every process of uid and wait until there is none: kill(-1, SIGKILL)
    sent as that uid reaches every process whose real or saved uid it is, in
    one pass the processes it kills cannot fork out of (kill(2)). The pids
    that were still there, if any survived `timeout` (none expected)."""
    deadline = time.monotonic() + timeout
    while True:
        left = processes_of(uid)
        if not left or time.monotonic() > deadline:
            return left
        subprocess.run([PY, "-I", "-S", "-c", "import os, signal\ntry:\n"
                        " os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n pass"],
                       user=uid, group=gid, extra_groups=[], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.05)


if __name__ == "__main__":
    enter()
