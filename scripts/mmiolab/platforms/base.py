"""What every grading platform is to the kit: a Platform.

A platform runs the grader in a container of its own, with the submission in
a folder it names and a results file it reads back; the kit writes that file
in the platform's format and packs what the instructor uploads. The pipeline
(stages.write, grade.grade_one) and the grade command take a Platform and name
none: each platform is a folder beside this file, registered in
platforms/__init__.py:

  __init__.py   its contract, results writer and checker, and PLATFORM
  pack.py       its packer (pack, default_out), an instructor's tool
  command.py    the subcommand that packs it (python3 -m mmiolab NAME)
  runner.py     how its own machines build the grading image and run a job
                (image, job, read: scripts/containers runs them in Docker)

Everything that names a platform (the grade command's flags, the pack
subcommands, scripts/containers, scripts/cleanroot --check) goes over the
registry, so adding a platform edits no other file.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..config import Config
from ..model import GradeResult


@dataclass(frozen=True)
class Container:
    """How a platform runs a grading job's container by default: its CPU share,
    memory and processes, its time limit, and whether it builds the image under
    the same limits (on its own machines). scripts/containers runs the kit in
    Docker with these; the numbers and their sources are in each platform's
    folder."""
    cpus: float                # docker run --cpus
    memory: str                # --memory (768m, 2g)
    timeout: int               # seconds a job may take before it is killed
    swap: str = ""             # --memory-swap ("": Docker's default)
    pids: int = 0              # --pids-limit (0: Docker's default)
    build_limited: bool = False

    def run_flags(self) -> tuple[str, ...]:
        """docker run's options for these limits."""
        return (f"--cpus={self.cpus:g}", f"--memory={self.memory}",
                *([f"--memory-swap={self.swap}"] if self.swap else []),
                *([f"--pids-limit={self.pids}"] if self.pids else []))

    def build_flags(self) -> tuple[str, ...]:
        """docker build's (the legacy builder takes a CPU quota, not --cpus)."""
        if not self.build_limited:
            return ()
        return ("--cpu-period=100000", f"--cpu-quota={round(self.cpus * 100000)}",
                f"--memory={self.memory}")


@dataclass(frozen=True)
class Platform:
    """One grading platform's contract with the grader in its container."""
    name: str                  # --platform NAME; what results and gradebooks call it
    title: str                 # as its users write it
    # The container's root (/autograder): the Config field that holds it, so
    # that an MMIOLAB_* variable moves it (tests do), or "" and root_default.
    root_setting: str
    student: str               # the submission's folder, under the root
    results: str               # the results file the platform reads, under the root
    write_results: Callable[[GradeResult, str], bool]   # whether it wrote the file
    problems: Callable[[Any], list[str]]     # what in a results document it would refuse
    package: str               # its folder's module: pack, command and runner are in it
    packs: str                 # what its pack subcommand makes (its line in the usage)
    container: Container       # its grading container's default limits
    root_default: str = ""     # the root where root_setting is "" (a new platform's:
                               # no Config field needed)

    def budget(self, cfg: Config) -> int:
        """Seconds one grading may take here: the limit the instructor set
        (MMIOLAB_TIME_LIMIT), else the platform's default."""
        return cfg.time_limit or self.container.timeout

    def root(self, cfg: Config) -> str:
        if not self.root_setting:
            return self.root_default
        value: str = getattr(cfg, self.root_setting)
        return value

    def submission(self, cfg: Config) -> str:
        return os.path.join(self.root(cfg), self.student)

    def results_path(self, cfg: Config) -> str:
        return os.path.join(self.root(cfg), self.results)

    def packer(self) -> ModuleType:
        """The platform's pack module, imported when asked: it needs the
        instructor's tools (handout.py), which an autograder does not carry."""
        return importlib.import_module(self.package + ".pack")

    @property
    def command(self) -> str:
        """The module of its pack subcommand (add_arguments, run)."""
        return self.package + ".command"

    def runner(self) -> ModuleType:
        """The platform's container runner (runner.py: image, job, read and
        ROOT_CHECK, over the dataclasses below), imported when asked."""
        return importlib.import_module(self.package + ".runner")


# What a platform's runner.py returns to the generic runners (scripts/containers
# builds and runs Docker images with them, scripts/cleanroot runs the same steps
# in a plain root): data, so that the runner itself needs no Docker to be tested.

@dataclass(frozen=True)
class ImageRecipe:
    """How the platform's machines would build its grading image from what the
    kit packed: docker build of `context` with `dockerfile` (which may lie
    outside it)."""
    context: str
    dockerfile: str
    packed: str                # the packed artifact's folder (jobs may take files from it)
    note: str = ""             # what the runner changed from the platform's build, said once


@dataclass(frozen=True)
class JobSpec:
    """One grading job's container, as the platform starts it: docker run's
    mounts and options, the command after the image (empty: its entrypoint),
    and where the platform reads the results file back, on this machine."""
    options: tuple[str, ...]
    command: tuple[str, ...]
    results: str


@dataclass(frozen=True)
class Reading:
    """What a platform makes of a results file: the score out of max_score
    (None: no score it would record), the tests that did not pass, why it is
    not a grade (problem), and whether the job graded at all (a refusal that
    the platform shows as "not gradable" says no confinement)."""
    score: float | None
    max_score: float | None
    failed: list[str]
    problem: str = ""
    graded: bool = True


@dataclass(frozen=True)
class RootCheck:
    """The same steps as the platform's image build and one job, as a shell
    script for a fresh Debian or Ubuntu root (scripts/cleanroot --check NAME):
    the packages it needs first, and the job. In `job`, /mnt/art holds the
    packed artifact and starter.c and solution.c; @LAB@ and @FILE@ are the
    lab and the file students hand in."""
    prereqs: tuple[str, ...]
    job: str
