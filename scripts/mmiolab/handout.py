"""What students get for a lab: the kit without the answers.

A handout is one tarball per lab, mmiolab-LAB.tar.gz, holding what a student
needs to build the lab VM, break and fix the driver and self-check it:

  Makefile, README.md, scripts/, vm/, patches/   the kit, to build the VM and grade
                                               (not the instructor's tools)
  labs/lab.mk, labs/LAB/                       the lab, without solutions/, fixtures/ and
                                               hidden/ (the grader's hidden tests)
  labs/OTHER/lab.toml                          a lab whose allow-list LAB borrows
  docs/                                        the student edition of the HTML pages
  HANDOUT.md                                   what to do, and what is left out

Symbolic links in the lab (a test program shared with another lab) are packed
as the files they point to. The docs are built with Sphinx's "-t student"
tag, which drops the lab pages' solutions and wrong fixes. Members are sorted
and carry no owner and the last commit's time, so the same commit packs to
the same bytes.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tarfile

from . import BUILD, ROOT
from .labspec import LabSpec

# What the student kit takes from the top of the tree; everything else (docs
# sources, the test suite, CI) stays with the instructor.
KIT_DIRS = ("scripts", "vm", "patches")
KIT_FILES = ("Makefile", "README.md", os.path.join("labs", "lab.mk"))
# What gives a lab's answers away: never handed out, never in an autograder.
ANSWER_DIRS = ("solutions", "fixtures", "correct")
# Never in a handout, wherever they appear in a lab (the autograder carries hidden/'s
# programs: gradescope.py).
SECRET_DIRS = ANSWER_DIRS + ("hidden",)
# Instructor tools: they run the solutions and fixtures, or pack handouts.
INSTRUCTOR_TOOLS = ("scripts/demo", "scripts/handout", "scripts/labstats", "scripts/trace-timeline",
                    "scripts/mmiolab/handout.py", "scripts/mmiolab/labtest.py")

HANDOUT_MD = """\
# mmiolab: lab "{name}"

{title}

This is the student handout of the mmiolab kit: it builds the lab kernel and
VM, and grades your driver exactly as your instructor's grader does. The
reference solutions, the wrong fixes the grader rejects, the kit's own test
suite and the sources of the documentation are not in it.

1. `make deps` installs the Debian packages the kit needs (once, as root or
   with sudo).
2. Read the lab: `docs/labs/{name}.html` (the whole documentation is in
   `docs/index.html`).
3. `make -C labs/{name} vm` builds your driver as the grader does and boots
   the lab VM with it (leave it with `exit` or Ctrl-A X); the banner says
   what to type, `record` traces a run, and `make -C labs/{name} timeline`
   draws the run you recorded (see "Explore first" on the lab's page).
4. Edit `labs/{name}/starter/{file}`, then self-check it:
   `make -C labs/{name} check` (or `make -C labs/{name} check SUBMISSION=my.c`).
5. Hand in `{file}`, and only that file.

`make demo`, `make check` and `make docs` need the full kit and say so here.
"""


class HandoutError(Exception):
    pass


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


def build_site(out: str) -> str:
    """The student edition of the HTML docs, in `out` (Sphinx -W: a warning fails)."""
    from . import kernel   # the docs take kernel-doc comments from the lab kernel tree
    kernel.build()
    doctrees = os.path.join(os.path.dirname(out), ".doctrees")
    shutil.rmtree(out, ignore_errors=True)
    res = subprocess.run(["/usr/bin/python3", "-m", "sphinx", "-W", "--keep-going", "-n", "-q",
                          "-t", "student", "-b", "html", "-d", doctrees, "-c", ".",
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


def pack(spec: LabSpec, site: str, out_dir: str, root: str = ROOT) -> str:
    """Write out_dir/mmiolab-LAB.tar.gz (atomically) and return its path."""
    top = f"mmiolab-{spec.name}"
    entries: list[tuple[str, str]] = []     # (name in the tarball, file on disk)
    for path in members(spec, kit_files(root)):
        src = os.path.join(root, path)
        if os.path.islink(src):
            real = os.path.realpath(src)
            if not real.startswith(os.path.realpath(root) + os.sep) or \
                    set(os.path.relpath(real, root).split(os.sep)) & set(SECRET_DIRS):
                raise HandoutError(f"{path}: links to {real}, which a handout cannot carry")
            src = real
        if os.path.isfile(src):
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
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        text = HANDOUT_MD.format(name=spec.name, title=spec.title, file=spec.files[0])
        _add(tar, f"{top}/HANDOUT.md", text.encode(), 0o644, when)
        for name, src in sorted(entries):
            with open(src, "rb") as f:
                data = f.read()
            if os.path.basename(name) == "lab.toml":
                data = student_toml(data.decode(), name.split(os.sep)[1]).encode()
            _add(tar, f"{top}/{name}", data, 0o755 if os.access(src, os.X_OK) else 0o644, when)
    os.replace(tmp, final)
    return final


def default_out() -> str:
    return os.path.join(BUILD, "handout")
