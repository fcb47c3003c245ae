"""Progress for long steps: which step, how long so far; full output goes to a log."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

from . import MmiolabError


def say(msg: str) -> None:
    print(f"mmiolab: {msg}", flush=True)


@contextlib.contextmanager
def step(name: str, tick: bool = False) -> Iterator[None]:
    """Say when a step starts and ends, and how long it took. tick: a step
    with no progress of its own also says every 30 s that it is still going."""
    t0 = time.monotonic()
    say(f"{name} ...")
    done = threading.Event()

    def ticker() -> None:
        while not done.wait(30):
            el = int(time.monotonic() - t0)
            say(f"{name}: {el // 60}m{el % 60:02d}s")

    th = threading.Thread(target=ticker, daemon=True) if tick else None
    if th:
        th.start()
    try:
        yield
    except BaseException:
        say(f"{name} FAILED after {time.monotonic() - t0:.1f}s")
        raise
    finally:
        done.set()
        if th:
            th.join()
    say(f"{name} done in {time.monotonic() - t0:.1f}s")


class CommandError(MmiolabError):
    """A logged command failed; the message names the log and shows its tail."""


def run_logged(cmd: list[str], log: str, label: str, cwd: str | None = None,
               env: dict[str, str] | None = None, count_prefix: str | None = None,
               count_about: int = 0, tail: int = 40) -> None:
    """Run cmd with its output in log, printing a one-line progress every few seconds.

    count_prefix: lines of output starting with it are counted and shown
    (e.g. '  CC' for a kernel build), so the user sees it advance;
    count_about, if known, is roughly how many there will be.
    """
    os.makedirs(os.path.dirname(log), exist_ok=True)
    t0 = time.monotonic()
    count = 0
    tty = sys.stdout.isatty()
    done = threading.Event()

    def ticker() -> None:
        last = 0.0
        while not done.wait(1.0):
            el = time.monotonic() - t0
            if tty or el - last >= 30:
                last = el
                msg = f"mmiolab: {label}: {int(el) // 60}m{int(el) % 60:02d}s"
                if count_prefix:
                    msg += ", " + compiled(count, count_about)
                print(("\r" + msg + "   ") if tty else msg, end="" if tty else "\n", flush=True)

    th = threading.Thread(target=ticker, daemon=True)
    th.start()
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout
        for line in proc.stdout:
            lf.write(line)
            if count_prefix and line.startswith(count_prefix):
                count += 1
        rc = proc.wait()
    done.set()
    th.join()
    if tty:
        print()
    if rc:
        with open(log, errors="replace") as lf:
            lines = lf.readlines()[-tail:]
        raise CommandError(f"{label} failed (exit {rc}); last lines of {log}:\n" + "".join(lines))


def compiled(count: int, about: int) -> str:
    """'N of about M files compiled'; past M (an estimate: the count of the
    host it was measured on), 'N files compiled'."""
    if about and count <= about:
        return f"{count} of about {about} files compiled"
    return f"{count} files compiled"


# The progress lines of scripts/demo and the kit (progress.step) that make a phase.
DEMO_PHASES = [
    ("unpack", r"kernel: unpack and patch"),
    ("configure", r"kernel: configure"),
    ("build", r"kernel: build \("),
    ("initramfs", r"initramfs"),
    ("first boot", r"boot the lab VM and run a command in it"),
    ("first grade", r"grade the doorbell lab's starter driver"),
    ("second grade", r"grade the reference solution"),
    ("docs", r"build the docs"),
    ("debug unpack", r"debug kernel: unpack and patch"),
    ("debug configure", r"debug kernel: configure"),
    ("debug build", r"debug kernel: build \("),
]
DONE_LINE = re.compile(r"^mmiolab: (.*) done in ([\d.]+)s$")


def phases(lines: list[str]) -> dict[str, float]:
    """Seconds per phase of a make demo (or make check) run, from its output lines."""
    out: dict[str, float] = {}
    for line in lines:
        m = DONE_LINE.match(line.strip())
        if not m:
            continue
        for name, rx in DEMO_PHASES:
            if re.match(rx, m.group(1)):
                out[name] = out.get(name, 0.0) + float(m.group(2))
                break
    return out


def timed(cmd: list[str], cwd: str | None, env: dict[str, str] | None, log: str) -> tuple[int, float, list[str]]:
    """Run cmd, show and log its output; (exit status, seconds, lines)."""
    t0 = time.monotonic()
    lines = []
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                errors="replace")
        assert proc.stdout
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lf.write(line)
            lines.append(line.rstrip("\n"))
        rc = proc.wait()
    return rc, time.monotonic() - t0, lines
