"""Headless Chromium driven over the DevTools protocol (pipe transport), for
tests/test_docs.py's browser tests.

Why not Chromium's own --dump-dom and --screenshot: they cannot report the
console errors, uncaught exceptions and requests leaving the machine that
those tests exist to catch, nor evaluate the rendered page's layout.
"""

import fcntl
import json
import os
import queue
import signal
import subprocess
import threading
import time

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
    "--remote-debugging-pipe",
]


class CDPError(Exception):
    pass


def _high_fd(fd):
    """Move fd to a number >= 10 (out of the way of the child's 3 and 4)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


class Chromium:
    """A headless Chromium driven through --remote-debugging-pipe.

    The browser reads commands on its fd 3 and writes replies and events on its
    fd 4, each message NUL-terminated JSON. bash maps our pipe ends onto those
    numbers; the ends are first moved to fds >= 10 so that neither is already
    3 or 4 (POSIX sh could not redirect such fds, hence bash).
    """

    def __init__(self, binary, profile_dir, log_path):
        to_child_r, self._to_child = map(_high_fd, os.pipe())
        self._from_child, from_child_w = map(_high_fd, os.pipe())
        script = (f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w} '
                  f'{to_child_r}<&- {from_child_w}>&-')
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", script, binary, *CHROMIUM_FLAGS,
             f"--user-data-dir={profile_dir}", "about:blank"],
            pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._replies = {}
        self._cond = threading.Condition()
        self.events = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._replies[None] = "closed"
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._replies[msg["id"]] = msg
                        self._cond.notify_all()
                else:
                    self.events.put(msg)

    def call(self, method, params=None, session=None, timeout=20.0):
        self._next_id += 1
        mid = self._next_id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while mid not in self._replies:
                if None in self._replies:
                    raise CDPError(f"{method}: the browser closed the connection")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CDPError(f"{method}: no reply in {timeout:.0f}s")
                self._cond.wait(left)
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)   # the group we started
            self.proc.wait(timeout=10)
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
