"""Grade lab submissions in the lab VM.

  scripts/grade --lab doorbell alice/ringdrv.c          one submission
  scripts/grade --lab doorbell -j2 class/               a class folder: one student
                                                        per folder, archive or .c file
  scripts/grade --lab doorbell --seed 7 alice.tar.gz    replay one seed
  scripts/grade --lab doorbell --platform gradescope    inside Gradescope's container
  scripts/grade --lab doorbell --platform prairielearn  inside PrairieLearn's container
                                                        (--gradescope, --prairielearn: the same)

A submission is a .c file, a folder, a .tar.gz/.tgz/.tar or a .zip. Per
submission the grader writes results.json (Gradescope), junit.xml,
summary.txt and console.log under --out/ID; per batch, gradebook.csv,
rewritten after each submission. A killed batch continues with --resume.

Each build is confined: in bubblewrap, or where that cannot work (a container
that forbids new namespaces) in the kit's jail (chroot, a uid of its own,
seccomp, Landlock); MMIOLAB_CONFINE=bubblewrap|jail forces one. Where neither
works, the grader stops unless --allow-unconfined-build is given, and then
every report says so.
Exit status: 0 when every submission was graded (whatever its score), 1 when
the grader failed on one, 2 when it could not start.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .. import initramfs, kernel, labspec
from ..config import Config
from ..grade import GradeOptions, entries_for, grade_batch, grade_one
from ..lab import RACE_CMDS, confinement
from ..model import NOT_CHARGED, TOO_SLOW
from ..platforms import PLATFORMS

# When this grader started: a platform's time limit runs from about then.
STARTED = time.monotonic()
# Of a platform's time limit, what a job needs besides the grading (its
# container's start before this process, results written after): seconds.
JOB_RESERVE = 30


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lab", required=True, choices=labspec.lab_names())
    ap.add_argument("-j", type=int, default=1, help="parallel VMs (at most the cores)")
    ap.add_argument("--seeds", type=int, help="race seeds per submission (default: the lab's)")
    ap.add_argument("--seed", type=int, action="append", help="this seed only (repeatable)")
    ap.add_argument("--cmds", type=int, default=RACE_CMDS,
                    help="commands per CPU per race run (default: %(default)s)")
    ap.add_argument("--out", help="where the outputs go (default: build/grades)")
    ap.add_argument("--resume", action="store_true", help="skip submissions already graded")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--platform", choices=list(PLATFORMS),
                      help="grade the one submission inside this platform's container")
    for p in PLATFORMS.values():        # the templates' spelling: --gradescope, ...
        mode.add_argument(f"--{p.name}", dest="platform", action="store_const", const=p.name,
                          help=f"grade {p.submission(Config())} into {p.results_path(Config())}")
    ap.add_argument("--append", action="append", default=[],
                    help="extra guest kernel command-line words, e.g. mmiosim.profile=pc")
    ap.add_argument("--allow-unconfined-build", action="store_true",
                    help="build unconfined where no confinement works (each report says so)")
    ap.add_argument("submissions", nargs="*")


def run(args: argparse.Namespace, cfg: Config) -> int:
    spec = labspec.load_lab(args.lab)
    if not os.path.exists(kernel.tree(cfg).bzimage):
        print("grade: the lab kernel is not built: run 'make kernel initramfs'", file=sys.stderr)
        return 2
    confined, why = confinement(cfg)
    if not confined:
        if not args.allow_unconfined_build:
            print(f"grade: cannot confine the module builds here: {why}\n"
                  f"grade: an unconfined build compiles student code with the grader's view "
                  f"of the files: #include and .incbin can read anything the grader can and "
                  f"print it back.\ngrade: fix the cause above, or pass "
                  f"--allow-unconfined-build (each report then says the build was "
                  f"unconfined)", file=sys.stderr)
            return 2
        print(f"grade: WARNING: building unconfined ({why})", file=sys.stderr)
    elif why:
        print(f"grade: module builds confined by {confined} ({why})".replace("\n", "; "),
              file=sys.stderr)
    initramfs.build(cfg)
    seeds = args.seed or (list(range(1, args.seeds + 1)) if args.seeds else list(spec.default_seeds))
    jobs = max(1, min(args.j, os.cpu_count() or 1))
    opts = GradeOptions(seeds=seeds, cmds=args.cmds,
                        out=os.path.abspath(args.out or os.path.join(cfg.build, "grades")),
                        resume=args.resume, append=tuple(args.append), confined=confined,
                        cfg=cfg)
    if args.platform:
        # The platform's container contract (platforms/NAME): where the submission
        # is, where its results go; MMIOLAB_AUTOGRADER and MMIOLAB_PRAIRIELEARN
        # move the roots (tests).
        platform = PLATFORMS[args.platform]
        opts.out = os.path.join(cfg.build, f"{platform.name}-run")
        # Stop before the platform does: a job it kills gets no result and no
        # reason, one stopped here is "too slow" with the reason in its log.
        budget = platform.budget(cfg)
        opts.deadline = STARTED + budget - JOB_RESERVE
        r = grade_one(spec, platform.submission(cfg), "submission", opts, platform=platform)
        print(f"grade: {r.score:g}/{r.max_score:g} ({r.verdict})")
        # The job's own output is the instructor's there, never the student's:
        # Gradescope shows it to staff only (results.json's stdout_visibility
        # "hidden"), PrairieLearn in the grading job's log.
        for f in r.flags:
            print(f"grade: flagged for the instructor: {f}")
        if r.verdict in NOT_CHARGED:
            # The platform's error output, for the instructor: not the student's.
            print("grade: not counted: " + "\n".join(r.notes[:3]), file=sys.stderr)
            if r.verdict == TOO_SLOW:
                print(f"grade: this job may take {budget}s on {platform.title} "
                      f"(MMIOLAB_TIME_LIMIT when its limit was raised) and had run "
                      f"{time.monotonic() - STARTED:.0f}s: give the job more time or more "
                      f"CPU ('scripts/kit calibrate' says what a submission takes here)",
                      file=sys.stderr)
            return 1
        return 0
    if not args.submissions:
        args.parser.error("no submissions given")
    entries = entries_for(spec, args.submissions)
    print(f"grade: {len(entries)} submission(s) of lab {spec.name}, seeds "
          f"{','.join(map(str, seeds))}, {jobs} VM(s) at a time; outputs in {opts.out}",
          flush=True)
    results = grade_batch(spec, entries, opts, jobs=jobs,
                          progress=lambda line: print(line, flush=True))
    print(f"grade: gradebook {os.path.join(opts.out, 'gradebook.csv')}")
    return 0 if all(r.verdict not in NOT_CHARGED for r in results) else 1
