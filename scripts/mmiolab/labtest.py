"""Run a lab's driver variants (starter, solutions, wrong-fix fixtures,
correct variants) over many seeds and count how often each per-seed test
fails: the claims the labs make ("the starter fails in essentially every run,
every solution and every correct variant passes, every wrong fix fails")
are measured, not assumed.

Solutions (labs/LAB/solutions/NAME.patch, "Solution (NAME): why") are
patches to the starter; fixtures (labs/LAB/fixtures/NAME.patch, first line
"Wrong fix (NAME): why") and correct variants (labs/LAB/correct/NAME.patch,
"Correct (NAME): why") are patches to the lab's fixture base (the starter
unless lab.toml says)."""

from __future__ import annotations

import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass

from . import guestout, ktap, model, stages, vm
from .config import Config
from .initramfs import HARNESS_LIB
from .lab import END_LINE, RACE_CMDS, build_driver, guest_programs, run_booted
from .stages import fabric_append
from .labspec import LabSpec, apply_patch


@dataclass
class Tally:
    variant: str
    test: str
    runs: int
    failed: int
    first_failure: list[int]      # per failing run: submissions (or cycles) until the first failure
    throughput: list[float]
    seconds: float
    failures: dict[int, list[str]]  # per failing seed: its diagnostics, to say why
    of: int = 0                   # a run stopped at its budget: the seeds asked for

    @property
    def partial(self) -> bool:
        """The guest was stopped at its time budget: runs are the seeds that
        reported (all of them, if what did not finish came after)."""
        return self.of > 0

    def partial_note(self) -> str:
        """For a table row: "" or what a row stopped at its time budget counts."""
        return (f"  partial: {self.runs} of {self.of} seeds, stopped at the budget"
                if self.partial else "")

    def why(self) -> str:
        """The failing seeds' diagnostics, for an assertion message."""
        return "\n".join(f"seed {s}: " + ("; ".join(d) or "no result")
                         for s, d in sorted(self.failures.items()))

    @property
    def median_first_failure(self) -> float | None:
        v = sorted(self.first_failure)
        return v[len(v) // 2] if v else None


PATCH_DIRS = {"fixture": "fixtures", "correct": "correct"}


def patches(spec: LabSpec, kind: str) -> list[str]:
    """The names of a lab's fixtures (kind "fixture") or correct variants."""
    d = os.path.join(spec.dir, PATCH_DIRS[kind])
    return sorted(f[:-6] for f in os.listdir(d) if f.endswith(".patch")) if os.path.isdir(d) else []


def variants(spec: LabSpec) -> list[str]:
    """starter, every solution, every correct variant, every fixture of the lab."""
    out = ["starter"]
    out += [f"solution:{n}" for n in spec.solutions]
    out += [f"correct:{n}" for n in patches(spec, "correct")]
    out += [f"fixture:{n}" for n in patches(spec, "fixture")]
    return out


def variant_source(spec: LabSpec, variant: str, workdir: str, cfg: Config) -> str:
    """starter, solution:NAME (spec.solution_source), fixture:NAME /
    correct:NAME (a patch applied to the lab's fixture base, in workdir), or
    patch:PATH (a patch to the starter kept elsewhere: the kit's tests' own
    drivers, tests/data/doorbell/)."""
    if variant == "starter":
        return spec.starter
    kind, name = variant.split(":", 1)
    if kind == "solution":
        return spec.solution_source(name, cfg)
    src = os.path.join(workdir, spec.files[0])
    if kind == "patch":
        apply_patch(spec.starter, name, src)
        return src
    apply_patch(spec.fixture_base_source(cfg), os.path.join(spec.dir, PATCH_DIRS[kind],
                                                          f"{name}.patch"), src)
    return src


def _tallies(spec: LabSpec, variant: str, seeds: list[int], channel: str, nonce: str,
             seconds: float, hidden: bool = False, partial: bool = False) -> dict[str, Tally]:
    """A Tally per per-seed test. A seed with no result failed, unless partial
    (a run stopped at its time budget): then only the seeds that reported count."""
    parsed = ktap.parse(guestout.without_heartbeats(channel, nonce), nonce=nonce)
    tallies = {}
    for graded in spec.per_seed_tests:
        if graded.source != ("hidden" if hidden else "ktap"):
            continue            # the other guest's tests
        test = parsed.root.find(graded.name)
        runs = {t.name: t for t in (test.subtests if test else [])}
        failed, first, thr, why = 0, [], [], {}
        reported = [s for s in seeds if f"seed_{s}" in runs] if partial else seeds
        for s in reported:
            t = runs.get(f"seed_{s}")
            if t is None or not t.status.ok:
                failed += 1
                why[s] = t.diagnostics() if t is not None else []
            if t is not None:
                vals = t.values()
                if "first_failure_at" in vals:
                    first.append(int(vals["first_failure_at"]))
                if "throughput_cps" in vals:
                    thr.append(float(vals["throughput_cps"]))
        tallies[graded.name] = Tally(variant, graded.name, len(reported), failed, first, thr,
                                     seconds, why, len(seeds) if partial else 0)
    return tallies


def run_variants(spec: LabSpec, names: list[str], seeds: list[int],
                 append: list[str] | None = None, cmds: int = RACE_CMDS,
                 timeout: float | None = None, env: dict[str, str] | None = None,
                 *, cfg: Config) -> dict[str, dict[str, Tally]]:
    """Several variants in one guest, one after the other, each under its own
    nonce: a boot per variant costs more than most variants' runs. A variant
    whose harness did not finish (a hang, a crash of the guest) and every
    variant after it are run again alone, so one cannot spoil another's count.
    `timeout` is per variant (default: budget()). `env`: more of the batch's
    harness environment (batch_command), such as a lab harness's own knobs
    for the test suite (the modern lab's RACE_ONLY, the posting lab's
    CYCLES); not for the variants run again alone."""
    timeout = timeout or budget(spec, seeds)
    out = {variant: _tallies(spec, variant, seeds, channel, nonce, seconds)
           for variant, (channel, nonce, seconds)
           in _run_batch(spec, names, seeds, append, cmds, timeout, cfg, env).items()}
    for variant in names:
        if variant not in out:
            out[variant] = run_variant(spec, variant, seeds, append=append, cmds=cmds,
                                       timeout=timeout, cfg=cfg)
    return out


def score_variants(spec: LabSpec, names: list[str], seeds: list[int],
                   append: list[str] | None = None, cmds: int = RACE_CMDS,
                   *, cfg: Config) -> dict[str, dict[str, model.TestOutcome]]:
    """The lab's harness-reported tests of each variant, scored as the grader
    scores them (stages.outcome_from_ktap), from one guest (run_variants'):
    what the cost test gives each. A variant whose harness did not finish
    is left out."""
    out = {}
    for variant, (channel, nonce, _) in _run_batch(spec, names, seeds, append, cmds,
                                                   budget(spec, seeds), cfg, None).items():
        parsed = ktap.parse(guestout.without_heartbeats(channel, nonce), nonce=nonce)
        found = parsed.expect(t.name for t in spec.ktap_tests)
        out[variant] = {g.name: stages.outcome_from_ktap(g, found[g.name], spec.phrases)
                        for g in spec.ktap_tests}
    return out


def _run_batch(spec: LabSpec, names: list[str], seeds: list[int], append: list[str] | None,
               cmds: int, timeout: float, cfg: Config,
               env: dict[str, str] | None) -> dict[str, tuple[str, str, float]]:
    """run_variants' guest: each variant whose harness finished, with the
    guest's channel, the variant's nonce and the guest's seconds."""
    base = os.path.join(cfg.build, "labtest", spec.name)
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        files: dict[str, str | bytes] = {
            "/job/harness.sh": spec.harness}
        for name, path in guest_programs(spec, cfg).items():
            files[f"/job/{name}"] = path
        nonces = []
        for i, variant in enumerate(names):
            work = os.path.join(tmp, f"v{i}")
            os.makedirs(work)
            built = build_driver(spec, variant_source(spec, variant, work, cfg),
                                 os.path.join(work, "build"), cfg=cfg)
            nonces.append(ktap.make_nonce())
            files[f"/job/v/{i}.ko"] = built.ko
            files[f"/job/v/{i}.nonce"] = f"{nonces[i]}\n".encode()
        batch = ktap.make_nonce()
        files["/job/v/batch.nonce"] = f"{batch}\n".encode()
        command = batch_command(spec.module, len(names), seeds, cmds, timeout, env)
        log_dir = os.path.join(base, "batch-" + re.sub(r"[^A-Za-z0-9._=-]", "-",
                                                       "-".join(append or ["default"])))
        options = vm.VMConfig.from_config(
            cfg, append=vm.RECORD_APPEND + fabric_append(spec) + list(append or []),
            timeout=timeout * len(names) + 60, done_marker=f"{batch} {END_LINE}")
        res = run_booted(command, files, options, log_dir)
    done = {variant: (res.channel, nonce, res.seconds) for variant, nonce in zip(names, nonces)
            if f"{nonce} {END_LINE}" in res.channel}
    if len(done) < len(names):
        # Said here: the log is overwritten by the next batch of this name.
        missing = ", ".join(v for v in names if v not in done)
        print(f"mmiolab: labtest: no end line from {missing}: {res.describe()} "
              f"(console: {res.log})", file=sys.stderr, flush=True)
    return done


def batch_command(module: str, count: int, seeds: list[int], cmds: int, timeout: float,
                  env: dict[str, str] | None = None) -> str:
    """run_variants' job script: variants 0..count-1 (/job/v/I.ko, I.nonce) in
    turn, then the batch's end line (/job/v/batch.nonce). Every end line comes
    from the harness library (vm/harness-lib.sh), sourced in a subshell, which
    tags its end line with the nonce in /job/nonce: a variant's harness prints
    its own, but one killed for outlasting its time cannot, so the loop prints
    it again after each. `env` goes to every harness, after SEEDS and CMDS.
    No trace is sent (TRACE_SEND=never, vm/harness-lib.sh): a batch counts
    failures and draws no picture of them."""
    end = f"( . {HARNESS_LIB} )"
    seed_list = " ".join(str(int(s)) for s in seeds)
    extra = "TRACE_SEND=never "
    for name, value in (env or {}).items():
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or name in ("SEEDS", "CMDS", "TRACE_SEND"):
            raise ValueError(f"not a harness variable run_variants may set: {name!r}")
        extra += f"{name}={shlex.quote(value)} "
    # Each variant gets the time one run of its own would: one that outlasts
    # it (a delay too long for the time limit) is stopped, and the seeds it
    # did not report count as failed, as the grader counts a run that hangs.
    return (f"for i in $(seq 0 {count - 1}); do "
            f"cp /job/v/$i.ko /job/{module}.ko; cp /job/v/$i.nonce /job/nonce; "
            f"SEEDS='{seed_list}' CMDS={int(cmds)} {extra}timeout -s KILL {int(timeout)} "
            f"sh /job/harness.sh; rmmod {module} 2>/dev/null; "
            f"cp /job/v/$i.nonce /job/nonce; {end}; "
            # A module that will not unload spoils what follows: stop, and
            # the variants after it run again alone.
            f"if grep -q '^{module} ' /proc/modules; then break; fi; done; "
            f"cp /job/v/batch.nonce /job/nonce; {end}")


def run_variant(spec: LabSpec, variant: str, seeds: list[int], append: list[str] | None = None,
                cmds: int = RACE_CMDS, timeout: float | None = None,
                hidden: bool = False, stop_after: float | None = None,
                *, cfg: Config) -> dict[str, Tally]:
    """Build the variant and run the lab's harness once, over all seeds, in one
    guest under the lab's fabric (plus `append`); a Tally per per-seed test.
    hidden: the lab's hidden tests instead, in their own guest and fabric.
    stop_after: a time budget (seconds) shorter than the run's time limit: a
    guest still running then is stopped, and the Tallies count the seeds that
    reported (Tally.partial)."""
    timeout = timeout or budget(spec, seeds)
    cut = stop_after is not None and stop_after < timeout
    if cut:
        timeout = stop_after
    base = os.path.join(cfg.build, "labtest", spec.name)
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        src = variant_source(spec, variant, tmp, cfg)
        built = build_driver(spec, src, os.path.join(tmp, "build"), cfg=cfg)
        # A plain folder name: QEMU's option syntax breaks paths with commas.
        name = variant + "-" + "-".join(append or ["default"]) + ("-hidden" if hidden else "")
        log_dir = os.path.join(base, re.sub(r"[^A-Za-z0-9._=-]", "-", name))
        # The grader's run stage, one guest of it (with the VM's default
        # console cap, as labstats has always run).
        run = stages.run_guest(spec, built.ko, seeds, log_dir, hidden=hidden, cmds=cmds,
                               append=list(append or []), timeout=timeout,
                               console_cap=vm.VMConfig.console_cap, cfg=cfg)
    stopped = cut and run.result.status == "hang"
    tallies = _tallies(spec, variant, seeds, run.result.channel, run.nonce, run.result.seconds,
                       hidden, partial=stopped)
    if run.result.status != "exited" and not stopped:
        # A hang or a crash fails every seed, as the grader counts it.
        for t in tallies.values():
            t.failed = t.runs
            t.failures = {s: [run.result.describe()] for s in seeds}
    return tallies


def budget(spec: LabSpec, seeds: list[int]) -> float:
    """The guest time a variant may take: the lab's run time limit, scaled from
    its default seeds to these."""
    return spec.limits.run_timeout * max(1.0, len(seeds) / max(1, len(spec.default_seeds)))
