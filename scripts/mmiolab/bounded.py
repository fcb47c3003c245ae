"""Run one step of the grader's own code on untrusted input in a child process
bounded in time and memory: reading a submission (submission.intake) and
reading what a guest printed (guestout.read). The caps inside each step bound
what the input may expand to; this bounds what reading it may cost, should a
crafted input send a decompressor or a parser astray anyway.

The child is the same Python with the mmiolab package, under prlimit (address
space, CPU time, no core), killed by the kernel if the grader dies first; the request goes in on stdin as JSON and the result
comes back on stdout as JSON. At the time limit it is killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from . import MmiolabError

PRLIMIT = "/usr/bin/prlimit"
#: setpriv(1) execs the rest with PR_SET_PDEATHSIG (prctl(2)) set to SIGKILL,
#: kept across exec. (A wrapper, not a preexec_fn, which is not safe in a
#: process with threads.)
_PDEATHSIG = ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--"]
#: A grader that dies before setpriv's prctl() sends no signal: its child,
#: already adopted by init or a subreaper, would run on (seen in CI, where the
#: grader was killed while setpriv was starting). So a shell, started after
#: the prctl(), goes on only if its parent is still the grader ($PPID is read
#: once, at the shell's start); from then on, the signal covers it.
_STILL_MY_GRADER = '[ "$PPID" = "$0" ] || exit 137; exec "$@"'


def dies_with_grader(cmd: list[str]) -> list[str]:
    """cmd, run so that the kernel kills it when this process ends, however it
    ends (kill -9 included), with no window at its start."""
    return [*_PDEATHSIG, "/bin/sh", "-c", _STILL_MY_GRADER, str(os.getpid()), *cmd]


_SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = ("import importlib, json, sys; sys.path.insert(0, sys.argv[1]); "
          "mod, fn = sys.argv[2].split(':'); "
          "req = json.load(sys.stdin); "
          "out = getattr(importlib.import_module('mmiolab.' + mod), fn)(req); "
          "sys.stdout.write(json.dumps(out))")


class Stopped(MmiolabError):
    """The child did not return a result; the message says why, in plain words
    ('reading it took more than 60s', 'reading it failed (MemoryError)')."""


def call(entry: str, request: dict[str, Any], timeout: float, memory: int) -> Any:
    """entry ('module:function' of mmiolab) applied to request in a bounded child;
    its JSON result, or Stopped."""
    cmd = dies_with_grader([PRLIMIT, f"--as={memory}", f"--cpu={int(timeout) + 1}", "--core=0",
                            "--", sys.executable, "-c", _CHILD, _SCRIPTS, entry])
    try:
        res = subprocess.run(cmd, input=json.dumps(request).encode(), capture_output=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Stopped(f"reading it took more than {timeout:.0f}s") from None
    except OSError as e:
        raise Stopped(f"reading it failed ({e})") from None
    if res.returncode == 0:
        try:
            return json.loads(res.stdout)
        except ValueError as e:
            raise Stopped(f"reading it failed ({e})") from None
    err = res.stderr.decode(errors="replace").strip().splitlines()
    raise Stopped(f"reading it failed ({err[-1]})" if err else
                  f"reading it was stopped (status {res.returncode})")
