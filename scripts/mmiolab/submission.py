"""Intake of one student submission into a fresh scratch directory.

A submission is untrusted input from the host's point of view: a `.c` file, a
folder, a tar (optionally gzip/bzip2/xz) or a zip made by anyone. The grader
only ever needs the few file names the lab allows (doorbell: ringdrv.c), so
intake copies exactly those, by *content*, into a scratch directory under
names the lab chose, and reports everything else it saw and why it ignored
it. Because no path of the submission is ever used as a path on the host,
nothing can land outside the scratch directory whatever the archive says;
the checks below exist to give each hostile or broken submission a clear
verdict, not to make extraction safe after the fact.

Rules, each with its verdict code (``Intake.verdict`` is ``ok`` or one of them):

- archive members are read one by one (tarfile in stream mode over our own
  decompressor, zipfile member by member); never ``extractall``;
- ``../x`` and absolute names -> path-traversal / absolute-path; symlinks and
  hardlinks are never followed -> symlink / hardlink; devices, fifos,
  sockets -> special-file;
- caps: bytes per file (file-too-large), entries per archive
  (too-many-members), declared and decompressed bytes of an archive, and the
  archive's own size (archive-too-large): a zip or gzip bomb stops early;
- a submitted source with NUL bytes -> binary-file, not UTF-8 -> not-utf8;
- a file name that is not UTF-8 -> bad-name; Makefile / Kbuild -> build-file
  (ignored, the grader owns the build); other names -> not-allowed;
- an allowed name found more than once -> ambiguous (refused: we do not
  guess which one the student meant); not found -> missing-file, or the
  reason its only candidate was refused; unreadable archive -> corrupt-archive.

A nested single top-level folder (``student/ringdrv.c``) is fine: a member is
a candidate for an allowed name wherever it sits, as long as it is the only one.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import lzma
import os
import re
import shutil
import stat
import struct
import tarfile
import tempfile
import unicodedata
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Literal, NamedTuple, Protocol, Sequence, cast

from . import MmiolabError

OK = "ok"
NOT_FOUND = "not-found"
UNSUPPORTED = "unsupported"
CORRUPT = "corrupt-archive"
EMPTY = "empty"
TOO_MANY = "too-many-members"
ARCHIVE_TOO_LARGE = "archive-too-large"
MISSING = "missing-file"
AMBIGUOUS = "ambiguous"
TRAVERSAL = "path-traversal"
ABSOLUTE = "absolute-path"
SYMLINK = "symlink"
HARDLINK = "hardlink"
SPECIAL = "special-file"
TOO_LARGE = "file-too-large"
BINARY = "binary-file"
NOT_UTF8 = "not-utf8"
BAD_NAME = "bad-name"
BUILD_FILE = "build-file"
NOT_ALLOWED = "not-allowed"
METADATA = "os-metadata"
HIDDEN = "hidden"
ENCRYPTED = "encrypted"
UNREADABLE = "unreadable"
TOO_DEEP = "too-deep"
INTAKE_LIMIT = "intake-limit"

#: Reasons that mean the submission tried (or happened) to reach outside itself.
UNSAFE = frozenset({TRAVERSAL, ABSOLUTE, SYMLINK, HARDLINK, SPECIAL})
BUILD_FILES = frozenset({"Makefile", "makefile", "GNUmakefile", "Kbuild", "Kconfig"})
TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar")
ZIP_SUFFIXES = (".zip",)
SOURCE_SUFFIXES = (".c",)
#: A class folder's child named so is one student's submission (roster.is_student).
STUDENT_SUFFIXES = TAR_SUFFIXES + ZIP_SUFFIXES + SOURCE_SUFFIXES


class SubmissionError(MmiolabError):
    """Misuse by the caller (bad scratch directory, class dir missing), not a student error."""


class _Refused(Exception):
    """Stops an archive scan with an overall verdict (too many members, bomb, corrupt)."""

    def __init__(self, verdict: str, message: str):
        super().__init__(message)
        self.verdict = verdict
        self.message = message


@dataclass(frozen=True)
class IntakeLimits:
    """Caps that keep a hostile submission from costing the host memory, disk or time.
    Its own type, not labspec.Limits: intake also runs with no lab (the class
    roster, a bounded child), and two caps are the kit's, not a lab's; a lab's
    come from its [limits] (labspec.Limits.intake)."""
    max_file_bytes: int = 1 << 20
    max_members: int = 500
    max_total_bytes: int = 32 << 20      # declared bytes of all archive members
    max_archive_bytes: int = 64 << 20    # the archive file itself
    max_depth: int = 16                  # folder nesting of a directory submission


DEFAULT_LIMITS = IntakeLimits()


@dataclass(frozen=True)
class Taken:
    """An allowed file copied into the scratch directory."""
    name: str      # the allowed name, as written in scratch
    source: str    # where it came from in the submission (printable)
    size: int
    path: str      # absolute path in scratch


@dataclass(frozen=True)
class Ignored:
    """Something in the submission that was not taken, and why."""
    source: str    # printable name
    reason: str    # a verdict code
    detail: str    # plain words


@dataclass
class Intake:
    """What intake did with one submission."""
    source: str
    kind: str                      # file | dir | tar | zip | unknown
    scratch: str
    verdict: str
    message: str
    taken: list[Taken] = field(default_factory=list)
    ignored: list[Ignored] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict == OK

    @property
    def unsafe(self) -> list[Ignored]:
        """Ignored entries that pointed outside the submission (worth telling the instructor)."""
        return [i for i in self.ignored if i.reason in UNSAFE]

    def files(self) -> dict[str, str]:
        """Allowed name -> path in scratch, for the build."""
        return {t.name: t.path for t in self.taken}

    def describe(self) -> str:
        """Human text: the verdict, then what was taken and ignored."""
        lines = [f"intake: {self.verdict}: {self.message}"]
        for t in self.taken:
            lines.append(f"  took     {t.name} ({t.size} bytes) from {t.source}")
        for i in self.ignored:
            lines.append(f"  ignored  {i.source}: {i.detail} [{i.reason}]")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Intake":
        return cls(source=d["source"], kind=d["kind"], scratch=d["scratch"],
                   verdict=d["verdict"], message=d["message"],
                   taken=[Taken(**t) for t in d["taken"]],
                   ignored=[Ignored(**i) for i in d["ignored"]])


class _Entry(NamedTuple):
    """One scanned entry: its printable name, its components, and a refusal if any."""
    shown: str
    parts: tuple[str, ...]
    reason: str | None
    detail: str
    size: int


# ---------------------------------------------------------------------------- names

def printable(name: str) -> str:
    """A file name safe to print on one line: undecodable bytes as \\xNN, controls escaped."""
    raw = name.encode("utf-8", "surrogateescape")
    text = raw.decode("utf-8", "backslashreplace")
    out = []
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") and ch != "\\":
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def _utf8_ok(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:       # lone surrogates: bytes that were not UTF-8
        return False
    return True


def _classify_name(name: str) -> tuple[tuple[str, ...], str | None, str]:
    """Split an archive member name and decide whether its *name* alone disqualifies it.

    Both '/' and '\\' count as separators, so a Windows-made '..\\x' is caught too.
    """
    parts = tuple(p for p in re.split(r"[/\\]", name) if p not in ("", "."))
    if not _utf8_ok(name):
        return parts, BAD_NAME, "file name is not valid UTF-8"
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        return parts, ABSOLUTE, "absolute path in the archive: never extracted"
    if ".." in parts:
        return parts, TRAVERSAL, "'..' in the path would leave the folder: never extracted"
    if not parts:
        return parts, UNREADABLE, "empty name"
    base = parts[-1]
    if "__MACOSX" in parts or base.startswith("._") or base in (".DS_Store", "Thumbs.db"):
        return parts, METADATA, "operating-system metadata"
    if any(p.startswith(".") for p in parts):
        return parts, HIDDEN, "hidden file or folder"
    return parts, None, ""


def _name_verdict(base: str, allowed: Sequence[str]) -> tuple[str, str]:
    if base in BUILD_FILES:
        return BUILD_FILE, "the grader builds with its own Kbuild; this file is ignored"
    hint = next((a for a in allowed if a.lower() == base.lower()), None)
    if hint:
        return NOT_ALLOWED, f"not graded; did you mean {hint}? (names are case-sensitive)"
    return NOT_ALLOWED, f"not graded (only {', '.join(allowed)})"


def _content_verdict(data: bytes) -> tuple[str | None, str]:
    """Refuse empty, binary and non-UTF-8 sources early, with words a student can act on."""
    if not data:
        return EMPTY, "empty file"
    nul = data.find(b"\0")
    if nul >= 0:
        return BINARY, (f"contains NUL bytes (first at offset {nul}): a binary, "
                        f"not C source")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = data[e.start]
        return NOT_UTF8, (f"not UTF-8 text (byte 0x{bad:02x} at offset {e.start}); "
                          f"save it as UTF-8")
    return None, ""


def _read_capped(f: IO[bytes], cap: int) -> bytes | None:
    """Read at most cap bytes; None if there is more (the declared size may lie)."""
    chunks = []
    left = cap + 1
    while left > 0:
        chunk = f.read(min(65536, left))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    return None if len(data) > cap else data


# ---------------------------------------------------------------------------- scan state

class _Cand(NamedTuple):
    """A file that bears an allowed name: real (a regular file at a safe place) or not."""
    shown: str
    real: bool
    data: bytes | None       # the content, for the first real candidate that passed
    reason: str | None       # why it cannot be used, if so
    detail: str


class _Collector:
    """Gathers candidates per allowed name while an archive or folder is scanned.

    A *real* candidate is a regular file at a safe place: two of them make the
    submission ambiguous even if one is, say, binary (we do not guess). Unsafe
    entries (a symlink named ringdrv.c, ../ringdrv.c) are never candidates to
    use; their reason becomes the verdict only when nothing real was found.
    """

    def __init__(self, allowed: Sequence[str], limits: IntakeLimits):
        self.allowed = list(allowed)
        self.limits = limits
        self.found: dict[str, list[_Cand]] = {a: [] for a in allowed}
        self.ignored: list[Ignored] = []
        self.members = 0

    def count(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise _Refused(TOO_MANY, f"more than {self.limits.max_members} entries: "
                                     f"submit only {', '.join(self.allowed)}")

    def ignore(self, shown: str, reason: str, detail: str) -> None:
        self.ignored.append(Ignored(shown, reason, detail))

    def entry(self, e: _Entry, read: Any) -> None:
        """Route one entry; read() returns its bytes (None when over the cap)."""
        base = e.parts[-1] if e.parts else ""
        wanted = base in self.found
        reason: str | None              # why the entry cannot be used, if so
        if e.reason is not None:
            self.ignore(e.shown, e.reason, e.detail)
            if wanted and e.reason not in (METADATA, HIDDEN):
                real = e.reason == ENCRYPTED
                self.found[base].append(_Cand(e.shown, real, None, e.reason, e.detail))
            return
        if not wanted:
            reason, detail = _name_verdict(base, self.allowed)
            self.ignore(e.shown, reason, detail)
            return
        cands = self.found[base]
        if any(c.real for c in cands):           # a second one: ambiguous, no need to read
            cands.append(_Cand(e.shown, True, None, None, ""))
            return
        reason, detail, data = None, "", None
        if e.size > self.limits.max_file_bytes:
            reason, detail = TOO_LARGE, (f"{e.size} bytes, over the "
                                         f"{self.limits.max_file_bytes}-byte cap")
        else:
            try:
                data = read()
            except (OSError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile,
                    tarfile.TarError, NotImplementedError, RuntimeError, ValueError) as ex:
                reason, detail = UNREADABLE, f"cannot be read: {ex}"
            else:
                if data is None:
                    reason, detail = TOO_LARGE, (f"over the {self.limits.max_file_bytes}"
                                                 f"-byte cap")
                else:
                    reason, detail = _content_verdict(data)
        if reason is not None:
            self.ignore(e.shown, reason, detail)
            data = None
        cands.append(_Cand(e.shown, True, data, reason, detail))


# ---------------------------------------------------------------------------- archives

class _Stream(Protocol):
    """What _CappedReader reads from: a file, a decompressor's file, _XzReader."""

    def read(self, n: int = ..., /) -> bytes: ...

    def close(self) -> None: ...


class _CappedReader:
    """A read-only stream that refuses to yield more than `cap` decompressed bytes.

    tarfile reads pax headers and skips member data by reading; bounding the
    decompressed stream bounds the memory and time a gzip bomb can cost.
    """

    def __init__(self, raw: _Stream, cap: int):
        self.raw = raw
        self.cap = cap
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        want = self.cap + 1 - self.pos if n is None or n < 0 else min(n, self.cap + 1 - self.pos)
        data = self.raw.read(want) if want > 0 else b""
        self.pos += len(data)
        if self.pos > self.cap:
            raise _Refused(ARCHIVE_TOO_LARGE,
                           f"the archive expands to more than {self.cap} bytes (an archive bomb?)")
        return data

    def close(self) -> None:
        self.raw.close()


def _sniff(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith(b"\x1f\x8b"):
        return "gz"
    if head.startswith(b"BZh"):
        return "bz2"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return ""


XZ_MEMLIMIT = 128 << 20      # xz -9 needs 65 MiB to decompress; a crafted header asks for GiBs


class _XzReader:
    """An .xz stream decoded with a memory limit (lzma.open has none: the header
    of a crafted file can make the decoder allocate gigabytes)."""

    def __init__(self, path: str, memlimit: int = XZ_MEMLIMIT):
        self.f = open(path, "rb")
        self.memlimit = memlimit
        self.dec = lzma.LZMADecompressor(lzma.FORMAT_AUTO, memlimit=memlimit)
        self.inbuf = b""

    def read(self, n: int = -1) -> bytes:
        want = 1 << 16 if n is None or n < 0 else n
        out = bytearray()
        while len(out) < want:
            if self.dec.eof:                     # concatenated streams, NUL padding
                self.inbuf = (self.dec.unused_data + self.inbuf).lstrip(b"\0")
                if not self.inbuf:
                    self.inbuf = self.f.read(1 << 16)
                    if not self.inbuf:
                        break
                    continue
                self.dec = lzma.LZMADecompressor(lzma.FORMAT_AUTO, memlimit=self.memlimit)
            if self.dec.needs_input and not self.inbuf:
                self.inbuf = self.f.read(1 << 16)
                if not self.inbuf:
                    raise EOFError("the xz stream ends early")
            out += self.dec.decompress(self.inbuf, max_length=want - len(out))
            self.inbuf = b""
        return bytes(out)

    def close(self) -> None:
        self.f.close()


def _scan_tar(path: str, comp: str, col: _Collector) -> None:
    openers: dict[str, Callable[[str, Literal["rb"]], _Stream]] = {
        "gz": gzip.open, "bz2": bz2.open, "xz": lambda p, mode: _XzReader(p)}
    opener = openers.get(comp, open)
    cap = col.limits.max_total_bytes + col.limits.max_members * 2048 + (1 << 20)
    declared = 0
    raw = opener(path, "rb")
    reader = _CappedReader(raw, cap)
    try:
        # typeshed asks tarfile.open for an IO[bytes]; a stream ("r|") only needs read().
        with tarfile.open(fileobj=reader, mode="r|", encoding="utf-8",  # type: ignore[arg-type]
                          errors="surrogateescape") as tf:
            for m in tf:
                col.count()
                declared += max(m.size, 0)
                if declared > col.limits.max_total_bytes:
                    raise _Refused(ARCHIVE_TOO_LARGE,
                                   f"members add up to more than {col.limits.max_total_bytes} "
                                   f"bytes (an archive bomb?)")
                parts, reason, detail = _classify_name(m.name)
                shown = printable(m.name)
                if m.isdir() and reason is None:
                    continue
                if reason is None:
                    if m.issym():
                        reason, detail = SYMLINK, (f"symbolic link to {printable(m.linkname)}: "
                                                   f"never followed")
                    elif m.islnk():
                        reason, detail = HARDLINK, (f"hard link to {printable(m.linkname)}: "
                                                    f"never followed")
                    elif m.ischr() or m.isblk() or m.isfifo():
                        kind = "character device" if m.ischr() else (
                            "block device" if m.isblk() else "fifo")
                        reason, detail = SPECIAL, f"{kind}: never created"
                    elif not m.isreg():
                        reason, detail = SPECIAL, f"unsupported entry type {m.type!r}"
                entry = _Entry(shown, parts, reason, detail, m.size)

                def read(m: tarfile.TarInfo = m) -> bytes | None:
                    f = tf.extractfile(m)
                    if f is None:
                        raise OSError("not a regular file")
                    return _read_capped(f, col.limits.max_file_bytes)
                col.entry(entry, read)
    except _Refused:
        raise
    except lzma.LZMAError as e:
        if "Memory usage limit" in str(e):
            raise _Refused(ARCHIVE_TOO_LARGE, f"the xz stream asks for more than "
                                              f"{XZ_MEMLIMIT >> 20} MiB to decompress") from e
        raise _Refused(CORRUPT, f"not a readable tar archive (LZMAError: {e})") from e
    except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as e:
        raise _Refused(CORRUPT, f"not a readable tar archive ({type(e).__name__}: {e})") from e
    finally:
        reader.close()


def _zip_entry_count(f: IO[bytes], stop: int) -> int | None:
    """Entries of a zip's central directory, counted the way zipfile will read them
    (record by record over the directory's declared size, not from the entry total
    the end record announces, which a crafted zip sets to 1), before zipfile builds
    one ZipInfo per entry. Stops counting past `stop`. None: no end record found."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    tail = min(size, 65535 + 22)
    f.seek(size - tail)
    data = f.read(tail)
    i = data.rfind(b"PK\x05\x06")
    if i < 0 or len(data) - i < 22:
        return None
    eocd = size - tail + i
    cd_size, = struct.unpack("<I", data[i + 12:i + 16])
    cd_end = eocd
    if i >= 20 and data[i - 20:i - 16] == b"PK\x06\x07":      # zip64 locator
        f.seek(eocd - 20 - 56)
        rec = f.read(56)
        if rec[:4] != b"PK\x06\x06":
            return None
        cd_size, = struct.unpack("<Q", rec[40:48])
        cd_end = eocd - 20 - 56
    start = cd_end - cd_size
    if start < 0:
        return None
    f.seek(start)
    cd = f.read(cd_size)
    n, pos = 0, 0
    while pos + 46 <= len(cd) and n <= stop:
        if cd[pos:pos + 4] != b"PK\x01\x02":
            break
        name_len, extra_len, comment_len = struct.unpack("<HHH", cd[pos + 28:pos + 34])
        pos += 46 + name_len + extra_len + comment_len
        n += 1
    return n


def _zip_name(zi: zipfile.ZipInfo) -> str:
    """The member name, with bytes that are not UTF-8 kept as surrogates (so bad-name fires).

    Names without the UTF-8 flag are decoded as cp437 by zipfile; re-encoding gives
    the raw bytes back, which are UTF-8 in practice or else not a usable name.
    """
    if zi.flag_bits & 0x800:
        return zi.filename
    try:
        raw = zi.filename.encode("cp437")
    except UnicodeEncodeError:
        return zi.filename
    return raw.decode("utf-8", "surrogateescape")


def _scan_zip(path: str, col: _Collector) -> None:
    try:
        with open(path, "rb") as f:
            n = _zip_entry_count(f, col.limits.max_members)
        if n is not None and n > col.limits.max_members:
            raise _Refused(TOO_MANY, f"the zip holds more than {col.limits.max_members} "
                                     f"entries: submit only {', '.join(col.allowed)}")
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            declared = 0
            for zi in infos:
                col.count()
                declared += zi.file_size
                if declared > col.limits.max_total_bytes:
                    raise _Refused(ARCHIVE_TOO_LARGE,
                                   f"members add up to more than {col.limits.max_total_bytes} "
                                   f"bytes (a zip bomb?)")
                name = _zip_name(zi)
                parts, reason, detail = _classify_name(name)
                if zi.is_dir() and reason is None:
                    continue
                mode = (zi.external_attr >> 16) & 0xFFFF
                if reason is None and zi.create_system == 3 and stat.S_IFMT(mode):
                    if stat.S_ISLNK(mode):
                        reason, detail = SYMLINK, "symbolic link: never followed"
                    elif not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                        reason, detail = SPECIAL, "device, fifo or socket: never created"
                if reason is None and zi.flag_bits & 0x1:
                    reason, detail = ENCRYPTED, "encrypted: submit it without a password"
                entry = _Entry(printable(name), parts, reason, detail, zi.file_size)

                def read(zi: zipfile.ZipInfo = zi) -> bytes | None:
                    with zf.open(zi) as f:
                        return _read_capped(f, col.limits.max_file_bytes)
                col.entry(entry, read)
    except _Refused:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
            UnicodeDecodeError, NotImplementedError, struct.error) as e:
        raise _Refused(CORRUPT, f"not a readable zip archive ({type(e).__name__}: {e})") from e


# ---------------------------------------------------------------------------- folders

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_regular(path: str, cap: int, dir_fd: int | None = None) -> bytes | None:
    """A regular file's bytes, opened without following a link (or waiting on a
    fifo): None if it holds more than cap bytes. OSError if it cannot be opened
    or is not a regular file."""
    fd = os.open(path, _FILE_FLAGS, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return _read_capped(f, cap)


def _scan_dir(path: str, col: _Collector) -> None:
    """Walk a folder through directory file descriptors, never following a symlink,
    so a folder swapped for a link while we walk cannot take us elsewhere."""
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError as e:
        raise _Refused(UNREADABLE, f"cannot open the folder: {e.strerror}") from e
    try:
        _walk(top, "", 0, col)
    finally:
        os.close(top)


def _walk(dfd: int, prefix: str, depth: int, col: _Collector) -> None:
    try:
        names = sorted(os.listdir(dfd))
    except OSError as e:
        col.ignore(printable(prefix or "."), UNREADABLE, f"cannot list: {e.strerror}")
        return
    for name in names:
        col.count()
        rel = f"{prefix}{name}"
        shown = printable(rel)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError as e:
            col.ignore(shown, UNREADABLE, f"cannot stat: {e.strerror}")
            continue
        parts, reason, detail = _classify_name(rel)
        if stat.S_ISDIR(st.st_mode):
            if reason is not None:
                col.ignore(shown + "/", reason, detail + " (folder not searched)")
            elif depth + 1 > col.limits.max_depth:
                col.ignore(shown + "/", TOO_DEEP, f"nested deeper than {col.limits.max_depth}")
            else:
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except OSError as e:
                    col.ignore(shown + "/", UNREADABLE, f"cannot open: {e.strerror}")
                    continue
                try:
                    _walk(sub, rel + "/", depth + 1, col)
                finally:
                    os.close(sub)
            continue
        if reason is None:
            if stat.S_ISLNK(st.st_mode):
                try:
                    target = printable(os.readlink(name, dir_fd=dfd))
                except OSError:
                    target = "?"
                reason, detail = SYMLINK, f"symbolic link to {target}: never followed"
            elif not stat.S_ISREG(st.st_mode):
                reason, detail = SPECIAL, "device, fifo or socket: never opened"

        def read(name: str = name) -> bytes | None:
            return read_regular(name, col.limits.max_file_bytes, dfd)
        col.entry(_Entry(shown, parts, reason, detail, st.st_size), read)


# ---------------------------------------------------------------------------- intake

def _prepare_scratch(scratch: str | None) -> str:
    if scratch is None:
        return tempfile.mkdtemp(prefix="mmiolab-intake-")
    try:
        os.mkdir(scratch, 0o755)
    except FileExistsError:
        st = os.lstat(scratch)
        if not stat.S_ISDIR(st.st_mode) or os.listdir(scratch):
            raise SubmissionError(f"scratch {scratch} must be a new or empty folder")
    return os.path.abspath(scratch)


def _kind(path: str, st: os.stat_result) -> tuple[str, str]:
    """(kind, compression) of a submission path, by content first, then by name."""
    if stat.S_ISDIR(st.st_mode):
        return "dir", ""
    lower = path.lower()
    if lower.endswith(SOURCE_SUFFIXES):
        return "file", ""
    magic = _sniff(path)
    if magic == "zip":
        return "zip", ""
    if magic in ("gz", "bz2", "xz", "tar"):
        return "tar", "" if magic == "tar" else magic
    if lower.endswith(TAR_SUFFIXES):
        return "tar", ""       # no known magic: try it as a plain tar, or say it is corrupt
    if lower.endswith(ZIP_SUFFIXES):
        return "zip", ""
    return "unknown", ""


def intake(path: str, allowed: Sequence[str], scratch: str | None = None,
           limits: IntakeLimits = DEFAULT_LIMITS, shown: str | None = None) -> Intake:
    """Copy the allowed files of one submission into a fresh scratch directory.

    Never raises for anything a student can put in a submission: the verdict says
    what happened. Files are written only when the verdict is ok, so a refused
    submission leaves an empty scratch directory. `shown` (printable) names the
    submission in what it says, as its student named it; by default, its path.
    """
    if not allowed:
        raise SubmissionError("the lab allows no files")
    scratch = _prepare_scratch(scratch)
    shown = printable(path) if shown is None else shown

    def result(kind: str, verdict: str, message: str, col: _Collector | None = None) -> Intake:
        # Both are str by now; mypy (1.0) does not carry that into a closure.
        return Intake(source=cast(str, shown), kind=kind, scratch=cast(str, scratch),
                      verdict=verdict, message=message, ignored=col.ignored if col else [])

    try:
        st = os.lstat(path)
    except OSError as e:
        return result("unknown", NOT_FOUND, f"{shown}: {e.strerror}")
    if stat.S_ISLNK(st.st_mode):
        return result("unknown", SYMLINK, f"{shown} is a symbolic link: never followed")
    if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
        return result("unknown", SPECIAL, f"{shown} is a device, fifo or socket")
    kind, comp = _kind(path, st)
    if kind != "dir" and st.st_size == 0:
        return result(kind, EMPTY, f"{shown} is an empty file")
    col = _Collector(allowed, limits)
    try:
        if kind == "dir":
            _scan_dir(path, col)
        elif kind == "file":
            _take_single_file(path, st, col)
        else:
            if kind == "unknown":
                return result(kind, UNSUPPORTED,
                              f"{shown} is not a .c file, a folder, a tar or a zip archive")
            if st.st_size > limits.max_archive_bytes:
                return result(kind, ARCHIVE_TOO_LARGE,
                              f"the archive is {st.st_size} bytes, over the "
                              f"{limits.max_archive_bytes}-byte cap")
            if kind == "tar":
                _scan_tar(path, comp, col)
            else:
                _scan_zip(path, col)
    except _Refused as r:
        return result(kind, r.verdict, r.message, col)
    return _decide(kind, shown, scratch, col)


def _take_single_file(path: str, st: os.stat_result, col: _Collector) -> None:
    """A bare .c file: with a one-file lab it *is* that file, whatever its name
    (a class folder of alice.c, bob.c); otherwise its name must be allowed."""
    col.count()
    base = os.path.basename(path)
    target = col.allowed[0] if len(col.allowed) == 1 else base
    shown = printable(base)
    if not _utf8_ok(base) and len(col.allowed) != 1:
        col.ignore(shown, BAD_NAME, "file name is not valid UTF-8")
        return

    def read() -> bytes | None:
        return read_regular(path, col.limits.max_file_bytes)
    col.entry(_Entry(shown, (target,), None, "", st.st_size), read)


def _decide(kind: str, shown: str, scratch: str, col: _Collector) -> Intake:
    """Turn the candidates into one verdict; write the files only if all is well."""
    chosen: dict[str, tuple[str, bytes]] = {}
    verdict, message = OK, ""
    for name in col.allowed:
        cands = col.found[name]
        real = [c for c in cands if c.real]
        if len(real) > 1:
            verdict = AMBIGUOUS
            message = (f"{name} found {len(real)} times ({', '.join(c.shown for c in real)}); "
                       f"submit exactly one")
            break
        if real and real[0].reason is None and real[0].data is not None:
            chosen[name] = (real[0].shown, real[0].data)
            continue
        bad = real[0] if real else (cands[0] if cands else None)
        if bad is not None:
            assert bad.reason is not None
            verdict, message = bad.reason, f"{bad.shown}: {bad.detail}"
        elif col.members == 0:
            verdict, message = EMPTY, f"the submission is empty: no {name}"
        else:
            verdict, message = MISSING, f"{name} is missing from the submission"
            if col.ignored:
                seen = ", ".join(f"{i.source} [{i.reason}]" for i in col.ignored[:3])
                more = f" and {len(col.ignored) - 3} more" if len(col.ignored) > 3 else ""
                message += f" (it holds {seen}{more})"
        break
    out = Intake(source=shown, kind=kind, scratch=scratch, verdict=verdict, message=message,
                 ignored=col.ignored)
    if verdict != OK:
        return out
    for name, (src, data) in chosen.items():
        dest = os.path.join(scratch, name)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        out.taken.append(Taken(name=name, source=src, size=len(data), path=dest))
    took = ", ".join(t.name for t in out.taken)
    extra = f"; {len(out.ignored)} other entries ignored" if out.ignored else ""
    out.message = f"took {took}{extra}"
    return out


def cleanup(result: Intake) -> None:
    """Remove the scratch directory of an intake."""
    shutil.rmtree(result.scratch, ignore_errors=True)


def intake_for_lab(spec: Any, path: str, scratch: str | None = None,
                   bounded: bool = False, shown: str | None = None) -> Intake:
    """intake() with a labspec.LabSpec's allowed files and caps (bounded: in a child
    process with a time and memory limit, as the grader does it)."""
    # (mypy joins the two signatures into a bare function: the return type it loses)
    run = cast(Callable[..., Intake], intake_bounded if bounded else intake)
    return run(path, spec.files, scratch, spec.limits.intake(), shown=shown)


# ---------------------------------------------------------------------------- bounded

INTAKE_TIMEOUT = 60.0
INTAKE_MEMORY = 1 << 30


def intake_bounded(path: str, allowed: Sequence[str], scratch: str | None = None,
                   limits: IntakeLimits = DEFAULT_LIMITS, timeout: float = INTAKE_TIMEOUT,
                   memory: int = INTAKE_MEMORY, shown: str | None = None) -> Intake:
    """intake() in a child process that may use `timeout` seconds and `memory` bytes
    (bounded.call): the caps above bound what an archive may expand to, this bounds
    what reading it may cost (a decompressor or a parser that a crafted file sends
    astray)."""
    from . import bounded
    scratch = _prepare_scratch(scratch)
    # A path is bytes to the OS: undecodable ones travel as surrogate escapes.
    request = {"path": os.fsdecode(os.fsencode(path)), "scratch": scratch,
               "allowed": list(allowed), "limits": asdict(limits), "shown": shown}
    try:
        return Intake.from_dict(bounded.call("submission:_intake_child", request, timeout,
                                             memory))
    except (bounded.Stopped, KeyError, TypeError) as e:
        why = str(e) if isinstance(e, bounded.Stopped) else f"reading it failed ({e})"
    for name in os.listdir(scratch):                 # a child stopped half way
        full = os.path.join(scratch, name)
        shutil.rmtree(full) if os.path.isdir(full) and not os.path.islink(full) else os.unlink(full)
    return Intake(source=printable(path) if shown is None else shown, kind="unknown",
                  scratch=scratch, verdict=INTAKE_LIMIT,
                  message=f"{why}: the grader reads a submission with at most {timeout:.0f}s "
                          f"and {memory >> 20} MiB (a crafted archive?)")


def _intake_child(req: dict[str, Any]) -> dict[str, Any]:
    """The bounded intake's child (bounded.call): the request's path into its scratch."""
    return intake(req["path"], req["allowed"], req["scratch"],
                  IntakeLimits(**req["limits"]), req.get("shown")).to_dict()


# ---------------------------------------------------------------------------- identity

def fingerprint(path: str, allowed: Sequence[str] = (),
                limits: IntakeLimits = DEFAULT_LIMITS) -> str:
    """A digest of a submission as handed in, so that --resume can tell a changed
    one, reading only what intake would read, under its caps (read_regular): a
    .c file's size and bytes (not past max_file_bytes + 1); an archive's size,
    and its bytes if it is within max_archive_bytes (intake refuses a bigger one
    unread); a folder's names, types and sizes (links not followed, at most
    max_depth deep and max_members entries, as intake walks it) and the
    contents of the files named as the lab allows (likewise). A folder of
    thousands of big or sparse files costs a listing, not a read."""
    h = hashlib.sha256()
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"missing:{e.errno}"
    if stat.S_ISDIR(st.st_mode):
        try:
            top = os.open(path, _DIR_FLAGS)
        except OSError as e:
            return f"unreadable:{e.errno}"
        try:
            _FolderDigest(h, set(allowed), limits).walk(top, "", 0)
        finally:
            os.close(top)
    elif stat.S_ISLNK(st.st_mode):
        h.update(b"link " + os.fsencode(os.readlink(path)))
    elif stat.S_ISREG(st.st_mode):
        _digest_single_file(h, path, st, limits)
    else:
        h.update(f"special {stat.S_IFMT(st.st_mode)}".encode())
    return "sha256:" + h.hexdigest()


def _digest_contents(h: hashlib._Hash, path: str, cap: int, dir_fd: int | None = None) -> None:
    """Adds a regular file's bytes to h, or a note that it is past cap or unreadable."""
    try:
        data = read_regular(path, cap, dir_fd)
    except OSError as e:
        h.update(f"unreadable {e.errno}".encode())
        return
    h.update(b"more than intake reads" if data is None else data)


def _digest_single_file(h: hashlib._Hash, path: str, st: os.stat_result,
                        limits: IntakeLimits) -> None:
    """Adds a submission that is one file (a .c file or an archive) to h: its size,
    and its bytes if intake would read them."""
    h.update(f"{stat.S_IFMT(st.st_mode)} {st.st_size}\n".encode())
    kind, _ = _kind(path, st)
    if kind == "file":
        _digest_contents(h, path, limits.max_file_bytes)
    elif kind != "unknown" and st.st_size <= limits.max_archive_bytes:
        _digest_contents(h, path, limits.max_archive_bytes)
    else:
        h.update(f"{kind} of {st.st_size} bytes: intake reads none of it".encode())


class _FolderDigest:
    """Adds a folder submission to h as intake walks it: names, types and sizes,
    links' targets, and the contents of the files named allowed."""

    def __init__(self, h: hashlib._Hash, allowed: set[str], limits: IntakeLimits):
        self.h = h
        self.allowed = allowed
        self.limits = limits
        self.seen = 0               # entries, over the whole tree

    def walk(self, dfd: int, prefix: str, depth: int) -> None:
        try:
            entries = sorted(os.listdir(dfd))
        except OSError as e:
            self.h.update(f"unlistable {e.errno}".encode())
            return
        for name in entries:
            self.seen += 1
            if self.seen > self.limits.max_members:
                self.h.update(b"more entries than intake reads")
                return
            self._entry(dfd, prefix, name, depth)

    def _entry(self, dfd: int, prefix: str, name: str, depth: int) -> None:
        h = self.h
        h.update(os.fsencode(prefix + name) + b"\0")
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError as e:
            h.update(f"unstatable {e.errno}".encode())
            return
        h.update(f"{stat.S_IFMT(st.st_mode)} {st.st_size}\n".encode())
        if stat.S_ISLNK(st.st_mode):
            try:
                h.update(b"link " + os.fsencode(os.readlink(name, dir_fd=dfd)))
            except OSError:
                pass
        elif stat.S_ISDIR(st.st_mode) and depth < self.limits.max_depth:
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            except OSError as e:
                h.update(f"unopenable {e.errno}".encode())
                return
            try:
                self.walk(sub, prefix + name + "/", depth + 1)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode) and name in self.allowed:
            _digest_contents(h, name, self.limits.max_file_bytes, dfd)
