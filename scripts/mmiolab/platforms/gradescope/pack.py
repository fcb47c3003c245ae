"""Pack the Gradescope autograder of a lab: the zip that Gradescope's
"Configure Autograder" page takes (an instructor's tool; the contract is in
the package's docstring). The zip holds, at its root:

  setup.sh           installs what grading needs from the image's own archive
                     (scripts/deps grade: QEMU, the kernel's gcc-N, make,
                     Python 3, bubblewrap), once; no kernel build
  run_autograder     scripts/grade --lab LAB --gradescope
  the kit            what the student handout has (scripts/ without the
                     instructor's tools, vm/, patches/, Makefile, the lab
                     without solutions/ and fixtures/, lab.toml without its
                     opening comment, prebuilt/: the lab kernel and the
                     guest's initramfs, built), plus the lab's hidden tests'
                     programs

Hidden tests (labs/LAB/hidden/) are run by the grader and left out of the
student handout. Their programs must be in the autograder, but nothing that
says what the fix is: from hidden/ only programs are packed (*.c, *.h, *.sh,
*.toml); notes, expected outputs, patches or anything else stay out. Nothing
from solutions/ or fixtures/ is packed, wherever it sits, and a link into them
stops the packing.
"""

from __future__ import annotations

import os
import stat
import time
import zipfile

from ... import ROOT
from ...config import Config
from ...handout import (ANSWER_DIRS, kit_files, kit_time, member_file, members, prebuilt,
                        student_toml)
from ...labspec import LabSpec
from ...template import fill

HIDDEN = "hidden"
HIDDEN_PROGRAMS = (".c", ".h", ".sh", ".toml")


def zip_members(spec: LabSpec, root: str = ROOT) -> list[str]:
    """The kit files the autograder of `spec` carries (paths relative to root)."""
    files = kit_files(root)
    keep = members(spec, [f for f in files if not _in_hidden(spec, f)])
    for path in files:
        if _in_hidden(spec, path) and path.endswith(HIDDEN_PROGRAMS) \
                and not set(path.split(os.sep)) & set(ANSWER_DIRS):
            keep.append(path)
    return sorted(keep)


def _in_hidden(spec: LabSpec, path: str) -> bool:
    return path.startswith(os.path.join("labs", spec.name, HIDDEN) + os.sep)


def read_member(root: str, path: str, carrier: str) -> tuple[bytes, str] | None:
    """A kit file's bytes as an autograder carries it (lab.toml as students get
    it) and the file read, whose mode it keeps; None if it is not a file. A
    link must stay inside the kit and out of the answers."""
    src = member_file(root, path, carrier, ANSWER_DIRS)
    if src is None:
        return None
    with open(src, "rb") as f:
        data = f.read()
    if os.path.basename(path) == "lab.toml":
        data = student_toml(data.decode(), path.split(os.sep)[1]).encode()
    return data, src


def pack(spec: LabSpec, out_dir: str, root: str = ROOT, allow_unconfined: bool = False, *,
         cfg: Config) -> str:
    """Write out_dir/mmiolab-LAB-autograder.zip (atomically); returns its path."""
    when = time.localtime(max(kit_time(root), 315532800))[:6]      # zip dates start in 1980
    entries: list[tuple[str, bytes, int]] = []
    for path in zip_members(spec, root):
        member = read_member(root, path, "an autograder")
        if member is not None:
            data, src = member
            entries.append((path, data, 0o755 if os.access(src, os.X_OK) else 0o644))
    built = prebuilt(root, cfg=cfg)
    for name, src in built.files:
        with open(src, "rb") as f:
            entries.append((name, f.read(), 0o755 if os.access(src, os.X_OK) else 0o644))
    entries += [(name, data, 0o644) for name, data in built.generated.items()]
    flags = " --allow-unconfined-build" if allow_unconfined else ""
    entries += [("setup.sh", fill("gradescope-setup.sh").encode(), 0o755),
                ("run_autograder",
                 fill("gradescope-run_autograder.sh", lab=spec.name, flags=flags).encode(), 0o755)]
    os.makedirs(out_dir, exist_ok=True)
    final = os.path.join(out_dir, f"mmiolab-{spec.name}-autograder.zip")
    tmp = final + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, data, mode in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=when)
            info.create_system = 3                    # Unix: keep the modes
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, final)
    return final


def default_out(cfg: Config) -> str:
    return os.path.join(cfg.build, "gradescope")
