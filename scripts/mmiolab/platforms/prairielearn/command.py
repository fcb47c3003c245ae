"""Pack a lab's PrairieLearn external grader: build/prairielearn/LAB/.

  scripts/prairielearn --lab doorbell --image you/mmiolab-doorbell   one lab
  scripts/prairielearn                                               every lab

LAB/question/ goes into the course's questions/ folder (it holds the hidden
tests' programs in tests/hidden/, which students cannot read); LAB/grader-image/
builds the image named in its info.json, which PrairieLearn pulls from a
public registry and which therefore holds no hidden tests and no answers. See
scripts/mmiolab/platforms/prairielearn/ for PrairieLearn's contract and its sources.
"""

from __future__ import annotations

import argparse

from ... import labspec
from ...commands import add_pack_arguments, pack_each
from ...config import Config
from . import pack as packer


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_pack_arguments(ap, "packs", "build/prairielearn", "the container")
    ap.add_argument("--image", default="",
                    help="the image name info.json gives (with one lab; {lab} is replaced "
                         "by the lab's name; default: a name that cannot be pulled, "
                         f"{packer.DEFAULT_IMAGE})")


def run(args: argparse.Namespace, cfg: Config) -> int:
    out = args.out or packer.default_out(cfg)
    return pack_each("prairielearn", args.lab or labspec.lab_names(),
                     lambda name: str(packer.pack(labspec.load_lab(name), out,
                                                  image=args.image.replace("{lab}", name),
                                                  allow_unconfined=args.allow_unconfined_build,
                                                  cfg=cfg)),
                     lambda path: f"{path}/question (the course's questions/), "
                                  f"{path}/grader-image (docker build)")
