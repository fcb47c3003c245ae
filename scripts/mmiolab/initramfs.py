"""Build the guest's initramfs: busybox-static, /init and static C helpers.

The archive is written in the kernel's "newc" cpio format by a small writer of
our own, so that device nodes (/dev/console) can be made without root and the
output is byte-for-byte reproducible. The same writer makes the small per-run
overlays (a job script, modules, test programs) that the VM launcher appends
to the base archive: the kernel unpacks concatenated archives in order.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import threading
from dataclasses import dataclass, field

from . import ROOT, MmiolabError
from .config import Config
from .progress import step

BUSYBOX = "/bin/busybox"
VM_DIR = os.path.join(ROOT, "vm")
GUEST_SRC = os.path.join(VM_DIR, "guest")
# A student handout carries the initramfs built (scripts/handout), with the
# digest of the kit files it was made from.
PREBUILT = os.path.join(ROOT, "prebuilt", "initramfs")
PREBUILT_INFO = "built-by.json"
USE_PREBUILT = os.path.isdir(PREBUILT)
# The guest's half of the harness protocol, which every lab's harness sources
# (vm/harness-lib.sh).
HARNESS_LIB = "/lib/mmiolab/harness-lib.sh"


# The interactive shell's. busybox's plain poweroff signals PID 1, which vm/init
# cannot act on while it waits for the shell: -f powers off at once.
PROFILE = """\
export PS1='mmiolab:\\w# '
export PATH=/bin:/sbin:/usr/bin
alias poweroff='poweroff -f' reboot='reboot -f' halt='halt -f'
"""


def out_dir(cfg: Config) -> str:
    """build/initramfs: the base archive and the guest helpers built."""
    return os.path.join(cfg.build, "initramfs")


def base(cfg: Config) -> str:
    """The base archive every guest boots (a handout's prebuilt one where there is one)."""
    return os.path.join(PREBUILT if USE_PREBUILT else out_dir(cfg), "base.cpio.gz")


class InitramfsError(MmiolabError):
    """The initramfs could not be built (missing busybox, a helper failed to compile)."""


@dataclass
class Entry:
    path: str               # absolute guest path
    mode: int               # full st_mode, type bits included
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


@dataclass
class Archive:
    """An in-memory cpio archive; parents of added files are created implicitly."""

    entries: dict[str, Entry] = field(default_factory=dict)

    def _parents(self, path: str) -> None:
        parent = os.path.dirname(path)
        while parent not in ("/", "") and parent not in self.entries:
            self.entries[parent] = Entry(parent, stat.S_IFDIR | 0o755)
            parent = os.path.dirname(parent)

    def dir(self, path: str, mode: int = 0o755) -> None:
        self._parents(path)
        self.entries[path] = Entry(path, stat.S_IFDIR | mode)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._parents(path)
        self.entries[path] = Entry(path, stat.S_IFREG | mode, data)

    def host_file(self, path: str, host_path: str, mode: int | None = None) -> None:
        with open(host_path, "rb") as f:
            data = f.read()
        if mode is None:
            mode = 0o755 if os.access(host_path, os.X_OK) else 0o644
        self.file(path, data, mode)

    def symlink(self, path: str, target: str) -> None:
        self._parents(path)
        self.entries[path] = Entry(path, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, path: str, major: int, minor: int, mode: int = 0o600) -> None:
        self._parents(path)
        self.entries[path] = Entry(path, stat.S_IFCHR | mode, rdev=(major, minor))

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        ino = 1
        # Parents sort before their children, as the kernel needs.
        for path in sorted(self.entries):
            e = self.entries[path]
            _write_member(out, ino, path.lstrip("/"), e.mode, e.data, e.rdev)
            ino += 1
        _write_member(out, 0, "TRAILER!!!", 0, b"", (0, 0))
        pad = -out.tell() % 512
        out.write(b"\0" * pad)
        return out.getvalue()


def _write_member(out: io.BytesIO, ino: int, name: str, mode: int, data: bytes,
                  rdev: tuple[int, int]) -> None:
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1],
              len(name) + 1, 0]
    out.write(b"070701" + b"".join(b"%08X" % v for v in fields))
    out.write(name.encode() + b"\0")
    out.write(b"\0" * (-out.tell() % 4))
    out.write(data)
    out.write(b"\0" * (-out.tell() % 4))


def compile_static(src: str, out: str, obj: str, flags: list[str] | None = None) -> None:
    """Compile one guest program as a static binary (guest programs are C).
    Built beside out and renamed over it: two graders packing it at once
    (scripts/grade -j2 after an edit) never see a half-written binary."""
    tmp = f"{out}.tmp{os.getpid()}.{threading.get_ident()}"
    # The compiler module builds use: where grading needs only that one
    # (scripts/deps grade installs gcc-N, not gcc), it is the one there is.
    from .kernel import module_compiler
    cmd = [module_compiler(obj).cc, "-static", "-O2", "-Wall", "-Werror", *(flags or []), "-o",
           tmp, src]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise InitramfsError(f"compiling {os.path.relpath(src, ROOT)} failed:\n{res.stderr}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def compile_programs(src_dir: str, bindir: str, obj: str, flags: list[str] | None = None,
                     headers: list[str] | None = None) -> dict[str, str]:
    """Compile every src_dir/*.c to a static bindir/NAME when it is out of date
    against its source or any of headers, with the compiler of the kernel
    built in obj; returns {name: path}."""
    os.makedirs(bindir, exist_ok=True)
    built = {}
    for name in sorted(os.listdir(src_dir)):
        if not name.endswith(".c"):
            continue
        src = os.path.join(src_dir, name)
        out = os.path.join(bindir, name[:-2])
        newest = max(os.path.getmtime(p) for p in [src] + list(headers or []))
        if not os.path.exists(out) or os.path.getmtime(out) < newest:
            compile_static(src, out, obj, flags)
        built[name[:-2]] = out
    return built


def guest_helpers(cfg: Config) -> dict[str, str]:
    """Compile vm/guest/*.c to build/initramfs/bin/; returns {name: path}."""
    from .kernel import tree
    return compile_programs(GUEST_SRC, os.path.join(out_dir(cfg), "bin"), tree(cfg).obj)


def base_archive(cfg: Config) -> Archive:
    if not os.path.exists(BUSYBOX):
        raise InitramfsError(f"{BUSYBOX} is missing: run 'make deps' (package busybox-static)")
    a = Archive()
    for d in ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/proc", "/sys", "/dev", "/tmp",
              "/root", "/etc", "/job", "/lib/modules"):
        a.dir(d)
    a.chardev("/dev/console", 5, 1)
    a.chardev("/dev/null", 1, 3, 0o666)
    a.host_file("/bin/busybox", BUSYBOX, 0o755)
    a.host_file("/init", os.path.join(VM_DIR, "init"), 0o755)
    a.host_file("/bin/record", os.path.join(VM_DIR, "record"), 0o755)
    a.host_file(HARNESS_LIB, os.path.join(VM_DIR, "harness-lib.sh"), 0o644)
    a.file("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    a.file("/etc/group", b"root:x:0:\n")
    a.file("/etc/profile", PROFILE.encode())
    for name, path in guest_helpers(cfg).items():
        a.host_file(f"/bin/{name}", path, 0o755)
    return a


def inputs_digest() -> str:
    """Of the kit's files that go into the base archive (not busybox, a package)."""
    h = hashlib.sha256(PROFILE.encode())
    paths = [os.path.join(VM_DIR, n) for n in ("init", "record", "harness-lib.sh")]
    paths += sorted(os.path.join(GUEST_SRC, n) for n in os.listdir(GUEST_SRC))
    for p in paths:
        h.update(os.path.basename(p).encode() + b"\0")
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def build(cfg: Config) -> str:
    """Write build/initramfs/base.cpio.gz if its content changed; returns its path.
    In a handout, checks that the prebuilt one was made from this kit's vm/."""
    BASE = base(cfg)
    if USE_PREBUILT:
        try:
            with open(os.path.join(PREBUILT, PREBUILT_INFO)) as f:
                made_from = json.load(f).get("inputs")
        except (OSError, ValueError):
            made_from = None
        if made_from != inputs_digest() or not os.path.exists(BASE):
            raise InitramfsError("vm/ differs from what the handout's initramfs was built "
                                 "from: restore it from the handout (or remove "
                                 "prebuilt/initramfs to build your own)")
        return BASE
    with step("initramfs"):
        data = base_archive(cfg).to_bytes()
        digest = hashlib.sha256(data).hexdigest()
        stamp = BASE + ".sha256"
        if os.path.exists(BASE) and os.path.exists(stamp) and open(stamp).read() == digest:
            return BASE
        os.makedirs(out_dir(cfg), exist_ok=True)
        tmp = f"{BASE}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            # mtime=0: the same inputs give the same bytes.
            f.write(gzip.compress(data, compresslevel=6, mtime=0))
        os.replace(tmp, BASE)
        with open(stamp + ".tmp", "w") as f:
            f.write(digest)
        os.replace(stamp + ".tmp", stamp)
    return BASE


def with_overlay(base: str, overlay: Archive, out: str) -> str:
    """Write base + overlay as one initrd file (the kernel unpacks both, in order)."""
    with open(base, "rb") as f:
        data = f.read()
    data += b"\0" * (-len(data) % 4)    # an uncompressed archive must start 4-aligned
    with open(out, "wb") as f:
        f.write(data)
        f.write(overlay.to_bytes())
    return out
