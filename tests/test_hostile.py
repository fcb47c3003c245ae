"""The grader against students who want the marks without the work.

SandboxTest: what a confined build can see and do. CorpusTest: a corpus of
hostile submissions, written here (no committed binaries), each with the
verdict it must get. Most are stopped at intake, at build time or by the
object checks, so they cost no guest; the few that must run are graded
together in one batch. Around the whole corpus the test checks that no
process outlives a build or a run (this process is made the subreaper of
everything the grader starts) and that nothing outside the scratch and
output folders changed.
"""

import ctypes
import dataclasses
import hashlib
import io
import json
import os
import re
import stat
import struct
import subprocess
import tarfile
import tempfile
import time
import unittest
import zipfile

from mmiolab import BUILD, ROOT, kernel, labspec, sandbox
from mmiolab.grade import GradeOptions, grade_batch
from mmiolab.lab import KERNEL_TREE, confinement, scratch_root
from vmtest import need_guest, report

LAB = os.path.join(ROOT, "labs", "doorbell")
PR_SET_CHILD_SUBREAPER = 36


def descendants(pid: int | None = None) -> list[tuple[int, str]]:
    """Processes whose parent chain reaches pid (default: this process)."""
    pid = pid or os.getpid()
    parent, names = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:
            continue
        name = data[data.index("(") + 1:data.rindex(")")]
        fields = data[data.rindex(")") + 2:].split()
        parent[int(entry)] = int(fields[1])
        names[int(entry)] = f"{name} [{fields[0]}]"
    out = []
    for p in parent:
        q, seen = p, 0
        while q in parent and seen < 64:
            q, seen = parent[q], seen + 1
            if q == pid:
                out.append((p, names[p]))
                break
    return out


def reap() -> None:
    """Collect zombies this process inherited as subreaper."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def tree_state(root: str, skip: tuple[str, ...] = ()) -> dict:
    """Every path under root with its type, size and content digest (links not followed)."""
    out = {}
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if os.path.join(top, d) not in skip)
        for name in dirs + files:
            full = os.path.join(top, name)
            st = os.lstat(full)
            digest = ""
            if stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(full, root)] = (stat.S_IFMT(st.st_mode), st.st_size, digest)
    return out


class SandboxTest(unittest.TestCase):
    """What a confined step sees: the toolchain and the kernel tree, read-only; one
    writable folder; no network, no host files, no kit; an unprivileged uid."""

    @classmethod
    def setUpClass(cls):
        ok, why = confinement()
        if not ok:
            raise AssertionError(f"builds cannot be confined on this machine: {why}")
        cls.box = tempfile.mkdtemp(prefix="sandbox-test-", dir=scratch_root())
        os.chmod(cls.box, 0o711)
        cls.rw = os.path.join(cls.box, "rw")
        os.mkdir(cls.rw)
        sandbox.prepare(cls.rw)

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.box, ignore_errors=True)

    def run_in(self, script, limits=sandbox.Limits(timeout=30)):
        return sandbox.run(["/bin/sh", "-c", script], self.rw, KERNEL_TREE,
                           os.path.join(self.box, "log"), limits)

    def test_view(self):
        probes = {
            "uid": "id -u",
            "kernel tree readable": f"test -r {kernel.OBJ}/Makefile && echo yes",
            "kernel tree read-only": f"touch {kernel.OBJ}/x 2>/dev/null || echo refused",
            "kit hidden": f"test -e {ROOT}/labs || echo hidden",
            "solutions hidden": f"ls {LAB}/solutions 2>/dev/null || echo hidden",
            "host files hidden": "test -e /etc/passwd || test -e /etc/shadow || echo hidden",
            "no /proc": "test -e /proc/self || echo none",
            "no /home, /root, /tmp": "test -e /home || test -e /root || test -e /tmp || echo none",
            "writable folder": "touch /build/ok && echo yes",
            "stdin is /dev/null": "cat; echo eof",
            "no network": "/usr/bin/python3 -c \"import socket\n"
                          "print(*[n for _, n in socket.if_nameindex()])\n"
                          "s = socket.socket()\ntry:\n s.connect(('192.0.2.1', 9))\n"
                          "except OSError as e:\n print(e.errno)\"",
            "no more user namespaces": "unshare -U true 2>/dev/null || echo refused",
        }
        want = {"uid": str(sandbox.SANDBOX_UID), "kernel tree readable": "yes",
                "kernel tree read-only": "refused", "kit hidden": "hidden",
                "solutions hidden": "hidden", "host files hidden": "hidden",
                "no /proc": "none", "no /home, /root, /tmp": "none", "writable folder": "yes",
                "stdin is /dev/null": "eof", "no network": "lo\n101",    # only lo; ENETUNREACH
                "no more user namespaces": "refused"}
        for label, script in probes.items():
            with self.subTest(label):
                res = self.run_in(script)
                self.assertEqual(res.output.strip(), want[label], str(res))

    def test_unprivileged_outside_too(self):
        """A mapped root would still be kuid 0 to the host (and exempt from NPROC)."""
        res = self.run_in("touch /build/owner")
        self.assertEqual(res.status, "ok", str(res))
        st = os.stat(os.path.join(self.rw, "owner"))
        expect = sandbox.SANDBOX_UID if os.geteuid() == 0 else os.geteuid()
        self.assertEqual(st.st_uid, expect)

    def test_limits(self):
        cases = {
            "fork bomb": ("i=0; while [ $i -lt 500 ]; do sleep 30 & i=$((i+1)); done; "
                          "echo started $i", "failed"),
            "output flood": ("yes flood", "flood"),
            "timeout": ("sleep 1000", "timeout"),
            "file size": ("head -c 100000000 /dev/zero > /build/big", "failed"),
        }
        limits = sandbox.Limits(timeout=5, processes=32, file_bytes=1 << 20, output_cap=64 << 10)
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        try:
            for label, (script, status) in cases.items():
                with self.subTest(label):
                    t0 = time.monotonic()
                    res = self.run_in(script, limits)
                    self.assertEqual(res.status, status, str(res))
                    self.assertLess(time.monotonic() - t0, 15)
                    reap()
                    self.assertEqual(descendants(), [], f"{label}: processes outlived the step")
        finally:
            prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        self.assertLessEqual(os.path.getsize(os.path.join(self.rw, "big")), 1 << 20)

    def test_the_grader_stops_without_confinement(self):
        """No bubblewrap: a clear error, unless the instructor allows it."""
        env = {**os.environ, "PATH": "/usr/bin:/bin"}
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from mmiolab import sandbox; sandbox.BWRAP = '/nonexistent/bwrap'\n"
                "sys.argv = ['grade', '--lab', 'doorbell', %r] + sys.argv[1:]\n"
                "exec(compile(open(%r).read(), 'grade', 'exec'), {'__name__': '__main__', "
                "'__file__': %r})\n") % (
            os.path.join(ROOT, "scripts"), os.path.join(LAB, "starter", "ringdrv.c"),
            os.path.join(ROOT, "scripts", "grade"), os.path.join(ROOT, "scripts", "grade"))
        with tempfile.TemporaryDirectory() as out:
            res = subprocess.run(["/usr/bin/python3", "-c", code, "--out", out],
                                 capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(res.returncode, 2, res.stdout + res.stderr)
            self.assertIn("cannot confine", res.stderr)
            self.assertIn("--allow-unconfined-build", res.stderr)
            self.assertEqual(os.listdir(out), [])
