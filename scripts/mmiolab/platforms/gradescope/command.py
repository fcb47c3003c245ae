"""Pack a lab's Gradescope autograder: build/gradescope/mmiolab-LAB-autograder.zip.

  scripts/gradescope --lab doorbell          one lab (make gradescope LAB=doorbell)
  scripts/gradescope                         every lab

Upload the zip on the assignment's "Configure Autograder" page, with a Debian 12
base image. The zip holds setup.sh (packages, kernel, guest: once), run_autograder
(one submission) and the kit without the labs' answers; see
scripts/mmiolab/platforms/gradescope/pack.py for what goes in and what stays out.
"""

from __future__ import annotations

import argparse
import os

from ... import labspec
from ...commands import add_pack_arguments, pack_each
from ...config import Config
from . import pack as packer


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_pack_arguments(ap, "zips", "build/gradescope", "the image")


def run(args: argparse.Namespace, cfg: Config) -> int:
    out = args.out or packer.default_out(cfg)
    return pack_each("gradescope", args.lab or labspec.lab_names(),
                     lambda name: str(packer.pack(labspec.load_lab(name), out,
                                                  allow_unconfined=args.allow_unconfined_build,
                                                  cfg=cfg)),
                     lambda path: f"{path} ({os.path.getsize(path) >> 10} KiB)")
