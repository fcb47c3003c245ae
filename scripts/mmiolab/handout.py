"""What students get for a lab: the kit without the answers.

A handout is one tarball per lab, mmiolab-LAB.tar.gz, holding what a student
needs to build the lab VM, break and fix the driver and self-check it:

  Makefile, README.md, scripts/, vm/, patches/   the kit, to build the VM and grade
                                               (not the instructor's tools)
  labs/lab.mk, labs/LAB/                       the lab, without solutions/, fixtures/ and
                                               hidden/ (the grader's hidden tests)
  labs/OTHER/lab.toml                          a lab whose allow-list LAB borrows
  docs/                                        the student edition of the HTML pages
  prebuilt/kernel/                             the lab kernel, built: its image and
                                               what an out-of-tree module build needs
  prebuilt/initramfs/                          the guest's initramfs, built
  HANDOUT.md                                   what to do, and what is left out

Symbolic links in the lab (a test program shared with another lab) are packed
as the files they point to. The docs are built with Sphinx's "-t student"
tag, which drops the lab pages' solutions and wrong fixes. Members are sorted
and carry no owner and the last commit's time, so the same commit packs to
the same bytes.

The prebuilt kernel holds what Debian's linux-headers packages hold, chosen
as the kernel's own scripts/package/builddeb (deploy_kernel_headers) chooses
it, in the kit's src/ and obj/ layout, with the kernel image; built-by.json
says which kit commit, patches and config built it, and the kit refuses it
if patches/ or vm/kernel.config no longer match (kernel.use_prebuilt).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import ROOT, MmiolabError
from .config import Config
from .labspec import LabSpec
from .template import fill

# What the student kit takes from the top of the tree; everything else (docs
# sources, the test suite, CI) stays with the instructor.
KIT_DIRS = ("scripts", "vm", "patches")
KIT_FILES = ("Makefile", "README.md", os.path.join("labs", "lab.mk"))
# What gives a lab's answers away: never handed out, never in an autograder.
ANSWER_DIRS = ("solutions", "fixtures", "correct")
# Never in a handout, wherever they appear in a lab (the autograder carries hidden/'s
# programs: platforms/gradescope/pack.py).
SECRET_DIRS = ANSWER_DIRS + ("hidden",)
# Instructor tools: they run the solutions and fixtures, or pack handouts (each a
# script and its command module: python3 -m mmiolab says they are not in the kit).
INSTRUCTOR_TOOLS = ("scripts/demo", "scripts/handout", "scripts/labstats", "scripts/trace-timeline",
                    "scripts/containers",
                    "scripts/mmiolab/handout.py", "scripts/mmiolab/labtest.py",
                    "scripts/mmiolab/commands/demo.py", "scripts/mmiolab/commands/handout.py",
                    "scripts/mmiolab/commands/labstats.py",
                    "scripts/mmiolab/commands/trace_timeline.py",
                    "scripts/mmiolab/gradebench.py", "scripts/mmiolab/commands/bench_grade.py")



class HandoutError(MmiolabError):
    pass


@dataclass
class Prebuilt:
    """What of the built kit a handout carries: (name in the kit, file on disk),
    symbolic links (name, target) and the generated built-by.json."""
    files: list[tuple[str, str]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    generated: dict[str, bytes] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def _find(top: str, rel: str, want: Callable[[str], bool] = lambda name: True,
          maxdepth: int = 0) -> list[str]:
    """Files (and links to files) under top/rel, relative to top, like find -type f."""
    out = []
    start = os.path.join(top, rel)
    if os.path.isfile(start):
        return [rel]
    base_depth = start.rstrip(os.sep).count(os.sep)
    for d, dirs, names in os.walk(start):
        if maxdepth and d.count(os.sep) - base_depth >= maxdepth - 1:
            dirs[:] = []
        for n in names:
            full = os.path.join(d, n)
            if want(n) and os.path.isfile(full):
                out.append(os.path.relpath(full, top))
    return out


def _kit_commit(root: str) -> str:
    res = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
                         capture_output=True, text=True)
    if res.returncode:
        return "no commit (not a git clone)"
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "patches", "vm"],
                           capture_output=True, text=True).stdout.strip()
    return f"commit {res.stdout.strip()}" + (" with uncommitted changes to patches/ or vm/"
                                             if dirty else "")


def prebuilt(root: str = ROOT, *, cfg: Config) -> Prebuilt:
    """The built lab kernel and initramfs, as a handout carries them."""
    from . import initramfs, kernel
    t = kernel.tree(cfg)
    src, obj = t.src, t.obj
    if not os.path.exists(t.bzimage) or not os.path.exists(os.path.join(obj, "Module.symvers")):
        raise HandoutError("the lab kernel is not built: run 'make kernel'")
    arch = "arch/x86"
    src_files = _find(src, ".", lambda n: n.startswith("Makefile"), maxdepth=1)
    src_files += _find(src, arch, lambda n: n.startswith("Makefile"), maxdepth=1)
    for rel in ("include", "scripts"):
        src_files += _find(src, rel)
    src_files += _find(src, arch, lambda n: n in ("Kbuild.platforms", "Platform"))
    for d, dirs, _ in os.walk(os.path.join(src, arch)):
        for sub in dirs:
            if sub in ("include", "scripts"):
                src_files += _find(src, os.path.relpath(os.path.join(d, sub), src))
    # Host objects and Kbuild's command records are not needed to build a module.
    skip = lambda n: not (n.endswith(".o") or n.startswith(".") and n.endswith(".cmd"))  # noqa: E731
    obj_files = [".config", "Module.symvers", "arch/x86/boot/bzImage"]
    if os.path.exists(os.path.join(obj, "tools/objtool/objtool")):
        obj_files.append("tools/objtool/objtool")
    for rel in (f"{arch}/include", "include", "scripts"):
        obj_files += _find(obj, rel, skip)
    for rel in obj_files:
        _check_runs_everywhere(os.path.join(obj, rel))
    pb = Prebuilt()
    top = os.path.join("prebuilt", "kernel")
    for rel in sorted(set(os.path.normpath(r) for r in src_files)):
        pb.files.append((os.path.join(top, "src", rel), os.path.join(src, rel)))
    for rel in sorted(set(os.path.normpath(r) for r in obj_files)):
        pb.files.append((os.path.join(top, "obj", rel), os.path.join(obj, rel)))
    # The build folder's Makefile and source link name the kernel tree by a
    # path of this machine's: in the handout they name it relatively.
    pb.generated[os.path.join(top, "obj", "Makefile")] = \
        b"# Generated by scripts/handout: the module build's entry point.\ninclude ../src/Makefile\n"
    pb.links.append((os.path.join(top, "obj", "source"), "../src"))
    with open(os.path.join(obj, "include", "config", "kernel.release")) as f:
        release = f.read().strip()
    with open(os.path.join(obj, "include", "generated", "compile.h")) as f:
        compiler = next((line.split('"')[1] for line in f if "LINUX_COMPILER" in line), "?")
    pb.info = {"kit": _kit_commit(root), "release": release, "compiler": compiler,
               "patches": kernel.patches_digest(t.patches),
               "config": kernel.config_digest(t), "source": os.path.basename(t.tarball)}
    pb.generated[os.path.join(top, kernel.PREBUILT_INFO)] = \
        (json.dumps(pb.info, indent=1, sort_keys=True) + "\n").encode()
    base = initramfs.build(cfg)
    pb.files.append((os.path.join("prebuilt", "initramfs", os.path.basename(base)), base))
    pb.generated[os.path.join("prebuilt", "initramfs", initramfs.PREBUILT_INFO)] = \
        (json.dumps({"inputs": initramfs.inputs_digest()}) + "\n").encode()
    return pb


# The newest glibc symbol version a shipped program may need: Ubuntu 22.04's
# glibc (2.35), the oldest system handouts and autograders are meant for.
# Debian 12 (2.36) links fixdep, modpost and objtool against 2.34 symbols.
NEWEST_GLIBC = (2, 35)
_GLIBC = re.compile(rb"GLIBC_(\d+)\.(\d+)")


def _check_runs_everywhere(path: str) -> None:
    """Refuse to ship a host program that needs a newer glibc than NEWEST_GLIBC."""
    with open(path, "rb") as f:
        head = f.read(4)
        if head != b"\x7fELF":
            return
        f.seek(0)
        data = f.read()
    need = max(((int(a), int(b)) for a, b in _GLIBC.findall(data)), default=(0, 0))
    if need > NEWEST_GLIBC:
        raise HandoutError(f"{path} needs glibc {need[0]}.{need[1]}, newer than Ubuntu "
                           f"22.04's {NEWEST_GLIBC[0]}.{NEWEST_GLIBC[1]}: build the kit's "
                           f"kernel on an older system to hand it out")


def kit_files(root: str = ROOT) -> list[str]:
    """The kit's files, relative to root: git's tracked files when root is a
    clone (so nothing generated or private slips in), else every file outside
    build/ and hidden folders."""
    if os.path.isdir(os.path.join(root, ".git")):
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True,
                             check=True).stdout
        return sorted(p for p in out.decode().split("\0") if p)
    files = []
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and os.path.join(top, d) != os.path.join(root, "build"))
        files += [os.path.relpath(os.path.join(top, n), root) for n in names]
    return sorted(files)


def members(spec: LabSpec, files: list[str]) -> list[str]:
    """The kit files a student of `spec` gets (paths relative to the kit root)."""
    lab = os.path.join("labs", spec.name) + os.sep
    borrowed = {os.path.join("labs", spec.symbols_from, "lab.toml")} if spec.symbols_from else set()
    keep = []
    for path in files:
        parts = path.split(os.sep)
        if path in INSTRUCTOR_TOOLS:
            continue
        if path in KIT_FILES or path in borrowed or parts[0] in KIT_DIRS:
            keep.append(path)
        elif path.startswith(lab) and not set(parts[2:-1]) & set(SECRET_DIRS):
            keep.append(path)
    return keep


def build_site(out: str, cfg: Config) -> str:
    """The student edition of the HTML docs, in `out` (Sphinx -W: a warning fails)."""
    from . import kernel   # the docs take kernel-doc comments from the lab kernel tree
    kernel.build(t=kernel.tree(cfg))
    doctrees = os.path.join(os.path.dirname(out), ".doctrees")
    shutil.rmtree(out, ignore_errors=True)
    # -E: every page is read again. The output is new anyway, and a doctree
    # kept from an older kit (other extensions, conf.py or CSS) would be
    # written as it was.
    res = subprocess.run(["/usr/bin/python3", "-m", "sphinx", "-W", "--keep-going", "-n", "-q",
                          "-E", "-t", "student", "-b", "html", "-d", doctrees, "-c", ".",
                          "Documentation", out], cwd=ROOT, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
    if res.returncode:
        raise HandoutError("the student edition of the docs did not build:\n"
                           + (res.stdout + res.stderr)[-4000:])
    return out


def student_toml(text: str, lab: str) -> str:
    """A lab.toml without its opening comment, which explains the fix to the
    instructor; the grading data itself is unchanged."""
    lines = text.splitlines(True)
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or not lines[i].strip()):
        i += 1
    return f"# Grading data of lab {lab}, as the instructor's grader uses it.\n\n" + "".join(lines[i:])


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, mtime
    tar.addfile(info, io.BytesIO(data))


def kit_time(root: str = ROOT) -> int:
    """The time the handout's files carry: the kit's last commit, so that the
    same commit packs to the same bytes (0 outside a clone)."""
    res = subprocess.run(["git", "-C", root, "log", "-1", "--format=%ct"], capture_output=True,
                         text=True)
    return int(res.stdout.strip() or 0) if res.returncode == 0 else 0


def _gcc_package(compiler: str) -> str:
    """'gcc (Debian 12.2.0-14+deb12u1) 12.2.0, GNU ld ...' -> 'gcc-12'."""
    m = re.search(r"\) (\d+)\.", compiler)
    return f"gcc-{m.group(1)}" if m else "gcc"


def member_file(root: str, path: str, carrier: str, forbidden: tuple[str, ...]) -> str | None:
    """The file a kit path names, or None if it is not a regular file. A link
    must stay inside the kit and out of the forbidden folders."""
    src = os.path.join(root, path)
    if os.path.islink(src):
        real = os.path.realpath(src)
        if not real.startswith(os.path.realpath(root) + os.sep) or \
                set(os.path.relpath(real, root).split(os.sep)) & set(forbidden):
            raise HandoutError(f"{path}: links to {real}, which {carrier} cannot carry")
        src = real
    return src if os.path.isfile(src) else None


def pack(spec: LabSpec, site: str, out_dir: str, root: str = ROOT,
         built: Prebuilt | None = None, *, cfg: Config) -> str:
    """Write out_dir/mmiolab-LAB.tar.gz (atomically) and return its path."""
    built = built or prebuilt(root, cfg=cfg)
    top = f"mmiolab-{spec.name}"
    entries: list[tuple[str, str]] = []     # (name in the tarball, file on disk)
    for path in members(spec, kit_files(root)):
        src = member_file(root, path, "a handout", SECRET_DIRS)
        if src is not None:
            entries.append((path, src))
    for top_dir, _, names in os.walk(site):
        for n in names:
            full = os.path.join(top_dir, n)
            if n != ".buildinfo":
                entries.append((os.path.join("docs", os.path.relpath(full, site)), full))
    if not any(p == os.path.join("labs", spec.name, "starter", spec.files[0]) for p, _ in entries):
        raise HandoutError(f"lab {spec.name}: no starter/{spec.files[0]} to hand out")

    os.makedirs(out_dir, exist_ok=True)
    final = os.path.join(out_dir, f"{top}.tar.gz")
    tmp = final + ".part"
    when = kit_time(root)
    with open(tmp, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=when) as gz, \
            tarfile.open(fileobj=gz, mode="w",  # type: ignore[arg-type]  # a GzipFile is a binary file
                         format=tarfile.PAX_FORMAT) as tar:
        info = built.info
        text = fill("handout-HANDOUT.md", name=spec.name, title=spec.title, file=spec.files[0],
                    compiler=_gcc_package(info["compiler"]),
                    built=f"Linux {info['release']} with the kit's patches, "
                          f"built by the kit at {info['kit']}, with {info['compiler']}")
        _add(tar, f"{top}/HANDOUT.md", text.encode(), 0o644, when)
        for name, data in sorted(built.generated.items()):
            _add(tar, f"{top}/{name}", data, 0o644, when)
        for name, target in built.links:
            info_l = tarfile.TarInfo(f"{top}/{name}")
            info_l.type, info_l.linkname, info_l.mode, info_l.mtime = \
                tarfile.SYMTYPE, target, 0o777, when
            tar.addfile(info_l)
        for name, src in sorted(entries + built.files):
            with open(src, "rb") as f:
                data = f.read()
            if os.path.basename(name) == "lab.toml":
                data = student_toml(data.decode(), name.split(os.sep)[1]).encode()
            _add(tar, f"{top}/{name}", data, 0o755 if os.access(src, os.X_OK) else 0o644, when)
    os.replace(tmp, final)
    return final


def default_out(cfg: Config) -> str:
    return os.path.join(cfg.build, "handout")
