"""The lab VM with the student's own driver in it, and their runs drawn.

`make -C labs/LAB vm` (scripts/kit labvm) builds the student's file with the
grader's own build and checks (stages.prepare: the same Kbuild, the same
confinement, the same messages), boots the lab VM with the lab's
fabric (lab.toml [fabric], plus FABRIC words) and puts the module, the lab's
test programs, a README and a banner in /job. The guest's `record` helper
(vm/record) sends each traced run through the second serial port, which the
host keeps in a file; `make -C labs/LAB timeline` (scripts/kit timeline)
draws the last one with timeline.draw().

Each boot is a session folder, build/explore/LAB/runs/STAMP/: console.log,
channel.log (the recordings, as sent), and what was drawn from them.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from . import ROOT, MmiolabError, initramfs, kernel, stages, timeline, vm
from .config import Config
from .lab import confinement, guest_programs, scratch_root
from .labspec import LabSpec, boot_words

KEEP_SESSIONS = 20
# The lab page's guest commands: lines of its literal blocks that start with
# the guest's prompt (vm/init's shell in /job); the banner shows them.
PROMPT = "mmiolab:/job# "
FABRIC_WORD = re.compile(r"^(?:mmiosim\.)?([a-z_][a-z0-9_]*)=([A-Za-z0-9_.,:+-]+)$")


class ExploreError(MmiolabError):
    """Something the student must fix first; the message says what."""


def out_dir(spec: LabSpec, cfg: Config) -> str:
    return os.path.join(cfg.build, "explore", spec.name)


def runs_dir(spec: LabSpec, cfg: Config) -> str:
    return os.path.join(out_dir(spec, cfg), "runs")


# --- the fabric ---------------------------------------------------------------


def fabric_words(spec: LabSpec, extra: str = "") -> list[str]:
    """Kernel command-line words for the lab's fabric, with the student's
    FABRIC words ("profile=pc jitter_ns=0", "mmiosim." optional) on top:
    a parameter given again replaces the lab's value."""
    params = stages.fabric_params(spec)
    for word in extra.split():
        m = FABRIC_WORD.match(word)
        if not m:
            raise ExploreError(f"FABRIC: {word!r} is not a fabric parameter: write NAME=VALUE, "
                               "e.g. FABRIC='profile=pc' (the names are those of "
                               "/sys/kernel/debug/mmiosim/params)")
        if m.group(1) == "semantics":       # the kit's old word for it
            raise ExploreError(f"FABRIC: semantics is called locking, as in "
                               f"/sys/kernel/debug/mmiosim/params: write "
                               f"FABRIC='locking={m.group(2)}'")
        params[m.group(1)] = m.group(2)
    return boot_words(params)


# --- the driver, built and checked as the grader does it ----------------------


@dataclass
class Built:
    ko: str
    shown: str                      # the submission, as the student named it
    warnings: list[str]
    notes: list[str] = field(default_factory=list)
    confined: bool = True


def build(spec: LabSpec, source: str, shown: str, cfg: Config) -> Built:
    """Intake, build and check one driver source as the grader does (stages.prepare);
    ExploreError with the grader's words (and the whole build log, as the compiler
    and modpost printed it) when it would not be run."""
    if not os.path.exists(source):
        raise ExploreError(f"{shown}: no such file")
    confined, why = confinement(cfg)
    work = tempfile.mkdtemp(prefix="explore-", dir=scratch_root(cfg))
    try:
        ready = stages.prepare(spec, source, work, shown=shown, confined=confined,
                               build_dir=os.path.join(out_dir(spec, cfg), "module"),
                               source_named=os.path.basename(shown), whole_build_log=True,
                               cfg=cfg)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if isinstance(ready, stages.Refused):
        raise ExploreError(ready.why)
    notes = ready.notes + ready.source_flags
    if not confined:
        notes.append(f"the build ran unconfined ({why}); the grader confines it")
    notes += ready.object_flags + ([ready.system_note] if ready.system_note else [])
    return Built(ready.ko, shown, ready.warnings, notes, bool(confined))


# --- what the guest gets ------------------------------------------------------


def page_commands(spec: LabSpec) -> list[str]:
    """The guest commands of the lab page's "Explore first" section."""
    path = os.path.join(spec.dir, "README.rst")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    return [line.strip()[len(PROMPT):] for line in text.splitlines()
            if line.strip().startswith(PROMPT)]


def banner(spec: LabSpec, built: Built, programs: list[str], cpus: int) -> str:
    cmds = page_commands(spec) or [f"insmod {spec.module}.ko", *programs,
                                   f"record {programs[0] if programs else 'COMMAND'}",
                                   f"rmmod {spec.module}"]
    lines = [f"mmiolab lab VM: {spec.title}",
             f"Your driver: /job/{spec.module}.ko, built from {built.shown}; "
             f"{cpus} CPUs. Read /job/README.", "",
             "Try (the commands of the lab page's \"Explore first\"):"]
    lines += [f"  {c}" for c in cmds]
    lines += ["", f"Leave with Ctrl-A X (or exit); then, on the host, "
                  f"make -C labs/{spec.name} timeline draws your last recording."]
    return "\n".join(lines) + "\n"


README = """\
mmiolab lab VM: {title}

What is here (/job, also on PATH)
  {module}.ko      your driver, built from {shown} with the grader's Kbuild
  {programs}      the lab's test program(s), the grader's own: -h lists the options
  record         runs a command with the fabric's trace events on, and sends
                 the trace to the host (a copy stays in /tmp/record-N.txt)
  README         this file

The lab page's commands ("Explore first"; also on the banner)
{commands}
Your driver
  insmod {module}.ko               load it (it binds to the card: dmesg says so)
  rmmod {module}                   unload it
  After a run that went wrong the card and your driver no longer agree on the
  ring: rmmod and insmod again before the next run (the grader loads your driver
  afresh for every seed). To try a changed driver, leave and make ... vm again.

The fabric and the card: /sys/kernel/debug/mmiosim/
  params          its settings (this VM's: {fabric})
  stats           its counters: writes posted and delivered, overtakes, reads, mmiowbs
  ring0/counters  the card's: doorbells, stale_doorbells, executed, stale_descriptors ...
  echo seed=7 > /sys/kernel/debug/mmiosim/params    another seed of its random draws
  Other settings at boot: on the host, make -C labs/{lab} vm FABRIC='profile=pc'
  (any NAME=VALUE of params).

Tracing
  record COMMAND                   trace one run of COMMAND, then draw it on the host;
                                   RECORD_KB=4096 record ... keeps more of a long run
  By hand (the events are enabled, tracing is off): echo 1 > /sys/kernel/tracing/tracing_on,
  run something, echo 0 > /sys/kernel/tracing/tracing_on, cat /sys/kernel/tracing/trace
  (echo mono > /sys/kernel/tracing/trace_clock first puts the lines on the fabric's clock;
  under clock=skip the events' t= run ahead of it, by as long as the fabric skipped).

Leaving, and the picture
  exit (or Ctrl-A X, or poweroff) leaves the VM. On the host:
    make -C labs/{lab} timeline          draws the last recording (SVG, in the browser)
    make -C labs/{lab} timeline REC=2    recording 2 of the last session
  and prints what it found: the first stale doorbell or late interrupt, with the
  lines of the trace around it.
"""


def readme(spec: LabSpec, built: Built, programs: list[str], words: list[str]) -> str:
    cmds = page_commands(spec)
    return README.format(title=spec.title, module=spec.module, shown=built.shown,
                         programs=", ".join(programs).ljust(9), lab=spec.name,
                         commands="".join(f"  {c}\n" for c in cmds) or "  (none)\n",
                         fabric=" ".join(w.removeprefix("mmiosim.") for w in words))


# The guest's own, with /job on PATH.
PROFILE = initramfs.PROFILE.replace("PATH=/bin:/sbin:/usr/bin", "PATH=/bin:/sbin:/usr/bin:/job")


def guest_files(spec: LabSpec, built: Built, cpus: int,
                words: list[str], cfg: Config) -> dict[str, str | bytes]:
    progs = guest_programs(spec, cfg)
    files: dict[str, str | bytes] = {f"/job/{spec.module}.ko": built.ko}
    for name, path in progs.items():
        files[f"/job/{name}"] = path
    names = sorted(progs)
    files["/job/README"] = readme(spec, built, names, words).encode()
    files["/job/banner"] = banner(spec, built, names, cpus).encode()
    files["/job/lab"] = f"{spec.name}\n".encode()
    files["/job/driver"] = f"{built.shown}\n".encode()
    files["/etc/profile"] = PROFILE.encode()
    return files


# --- sessions and recordings --------------------------------------------------


def new_session(spec: LabSpec, cfg: Config) -> str:
    """A fresh session folder; only the newest KEEP_SESSIONS are kept."""
    base = runs_dir(spec, cfg)
    os.makedirs(base, exist_ok=True)
    old = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    for d in old[:max(0, len(old) - KEEP_SESSIONS + 1)]:
        shutil.rmtree(os.path.join(base, d), ignore_errors=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = os.path.join(base, stamp), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(base, f"{stamp}-{n}")
    os.makedirs(path)
    return path


Recording = timeline.Recording


def recordings(channel: str) -> list[Recording]:
    """The recordings a session's channel file holds, in the order sent."""
    try:
        with open(channel, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return []
    return timeline.recordings_in(data)


def save_recordings(session: str) -> list[str]:
    """Write each whole recording of a session as record-N.txt; their paths."""
    paths = []
    for rec in recordings(os.path.join(session, "channel.log")):
        if rec.text:
            path = os.path.join(session, f"record-{rec.number}.txt")
            if not os.path.exists(path):
                with open(path, "w", encoding="utf-8") as f:
                    f.write(rec.text)
            paths.append(path)
    return paths


def sessions(spec: LabSpec, cfg: Config) -> list[str]:
    """Session folders, newest first."""
    base = runs_dir(spec, cfg)
    if not os.path.isdir(base):
        return []
    return [os.path.join(base, d) for d in sorted(os.listdir(base), reverse=True)
            if os.path.isdir(os.path.join(base, d))]


def shown_path(path: str) -> str:
    """A path as the student should see it: from the top of the kit."""
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


# --- the whole commands ---------------------------------------------------------


def labvm(spec: LabSpec, source: str, shown: str, fabric: str = "", smp: int = 0,
          accel: str = "", say: Callable[[str], object] = print,
          *, cfg: Config) -> int:
    """Build, check, boot; after the VM exits, say what was recorded."""
    words = fabric_words(spec, fabric)
    built = build(spec, source, shown, cfg)
    say(f"mmiolab: {spec.name}: built {spec.module}.ko from {shown} with the grader's Kbuild"
        + (" and checks" if built.confined else ""))
    if built.warnings:
        say("mmiolab: the build printed warnings (the grader's build test fails on any):\n  "
            + "\n  ".join(built.warnings))
    for note in built.notes:
        say(f"mmiolab: note: {note}")
    options = vm.VMConfig.from_config(cfg, append=vm.RECORD_APPEND + words, smp=smp,
                                      accel=accel)
    session = new_session(spec, cfg)
    say(f"mmiolab: fabric: {' '.join(words)}")
    rc = vm.interactive(options, files=guest_files(spec, built, options.smp, words, cfg),
                        log_dir=session)
    saved = save_recordings(session)
    broken = [r for r in recordings(os.path.join(session, "channel.log")) if not r.text]
    for r in broken:
        say(f"mmiolab: recording {r.number} is incomplete: {r.problem}")
    if saved:
        say(f"mmiolab: {len(saved)} recording(s) in {shown_path(session)}; draw the last one "
            f"with: make -C labs/{spec.name} timeline")
    return rc


@dataclass
class Drawn:
    trace: str
    svg: str
    html: str
    excerpt: str
    drawing: timeline.Drawing


def find_recording(spec: LabSpec | None, rec: int = 0, path: str = "",
                   *, cfg: Config) -> tuple[str, str]:
    """(trace text, its file) of the recording to draw: `path` (a trace, or a
    session's channel.log), else recording `rec` (default: the last) of the
    newest session of the lab that has one."""
    if path:
        if not os.path.exists(path):
            raise ExploreError(f"{path}: no such file")
        if path.endswith("channel.log") or os.path.isdir(path):
            session = path if os.path.isdir(path) else os.path.dirname(path)
            return _pick(session, rec)
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(), path
    assert spec is not None
    for session in sessions(spec, cfg):
        if os.path.exists(os.path.join(session, "channel.log")) and \
                recordings(os.path.join(session, "channel.log")):
            return _pick(session, rec)
    raise ExploreError(f"no recording of lab {spec.name} yet: in the lab VM "
                       f"(make -C labs/{spec.name} vm), run e.g. 'record ringtest' first")


def _pick(session: str, rec: int) -> tuple[str, str]:
    recs = recordings(os.path.join(session, "channel.log"))
    if not recs:
        raise ExploreError(f"{shown_path(session)}: no recording in this session")
    pick = next((r for r in recs if r.number == rec), None) if rec else recs[-1]
    if pick is None:
        raise ExploreError(f"{shown_path(session)}: no recording {rec} (it has "
                           f"{', '.join(str(r.number) for r in recs)})")
    if not pick.text:
        raise ExploreError(f"recording {pick.number} of {shown_path(session)} is incomplete: "
                           f"{pick.problem}")
    path = os.path.join(session, f"record-{pick.number}.txt")
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(pick.text)
    return pick.text, path


def draw_file(text: str, path: str, title: str = "", *, cfg: Config) -> Drawn:
    """Draw a recorded trace next to it: .svg, .html (picture, finding, excerpt)
    and .excerpt.txt (the card's register names from cfg's kernel tree)."""
    if not title:
        lab, driver, cmd = (header_value(text, k) for k in ("lab", "driver", "command"))
        title = (f"{lab} lab, {driver}: " if lab and driver else "") + \
            (f"record {cmd}" if cmd else os.path.basename(path))
    d = timeline.draw(text, title=title, ident="tl", ring=timeline.ring(kernel.tree(cfg).src))
    stem = path[:-4] if path.endswith(".txt") else path
    out = Drawn(path, stem + ".svg", stem + ".html", stem + ".excerpt.txt", d)
    if d.svg:
        with open(out.svg, "w", encoding="utf-8") as f:
            f.write(d.svg)
    with open(out.html, "w", encoding="utf-8") as f:
        f.write(timeline.html_page(d, title))
    with open(out.excerpt, "w", encoding="utf-8") as f:
        f.write(d.excerpt)
    return out


def header_value(text: str, key: str) -> str:
    """The value of a recorded trace's "# key: value" header line ('' if none)."""
    m = re.search(rf"(?m)^# {key}: (.*)$", text[:65536])
    return m.group(1).strip() if m else ""
