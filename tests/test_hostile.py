"""The grader against students who want the marks without the work.

SandboxTest: what a confined build can see and do, at the level the probe
picks (MMIOLAB_CONFINE=bubblewrap or jail forces one: the whole module
passes with each). JailTest: the jail itself, forced (as root). CorpusTest: a corpus of
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

from mmiolab import ROOT, jail, labspec, sandbox
from mmiolab.config import Config
from mmiolab.grade import GradeOptions, entries_for, grade_batch
from mmiolab.lab import confinement, kernel_tree, scratch_root
from mmiolab.model import TOO_SLOW
from kitcfg import BUILD, CFG, TREE
from vmtest import report

LAB = os.path.join(ROOT, "labs", "doorbell")
# The reference solution as the kit keeps it (a patch) and as its tools make it
# (a file under build/): a hostile build must see neither.
SOLUTION_PATCH = os.path.join(LAB, "solutions", "mmiowb.patch")


def solution_file() -> str:
    return labspec.load_lab("doorbell").solution_source("mmiowb", CFG)
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


class KernelTreeTest(unittest.TestCase):
    def test_resolved_when_the_build_runs(self):
        """A cold `make demo` imports the grader before the kernel is built:
        the tree a build may read is resolved then, not at import (every
        build of a cold demo failed in bubblewrap once)."""
        with tempfile.TemporaryDirectory() as tmp:
            code = (
                "import os\n"
                "from mmiolab import kernel, lab\n"
                "from mmiolab.config import Config\n"
                "cfg = Config.from_env()\n"
                "t = kernel.tree(cfg)\n"
                "os.makedirs(t.src)\n"
                "os.makedirs(t.obj)\n"
                "os.symlink(t.src, os.path.join(t.obj, 'source'))\n"
                "import json; print(json.dumps(lab.kernel_tree(cfg)))\n")
            env = {**os.environ, "MMIOLAB_BUILD": os.path.join(tmp, "build")}
            env.pop("MMIOLAB_DEBUG", None)
            res = subprocess.run(["/usr/bin/python3", "-c", code], env=env, text=True,
                                 capture_output=True, cwd=os.path.join(ROOT, "scripts"))
            self.assertEqual(res.returncode, 0, res.stderr)
            tree = json.loads(res.stdout)
            kdir = os.path.realpath(os.path.join(tmp, "build", "kernel"))
            self.assertEqual(tree, [os.path.join(kdir, "obj"), os.path.join(kdir, "src")])


class SandboxTest(unittest.TestCase):
    """What a confined step sees: the toolchain and the kernel tree, read-only; one
    writable folder; no network, no host files, no kit; an unprivileged uid."""

    @classmethod
    def setUpClass(cls):
        cls.level, why = confinement(CFG)
        if not cls.level:
            raise AssertionError(f"builds cannot be confined on this machine: {why}")
        cls.box = tempfile.mkdtemp(prefix="sandbox-test-", dir=scratch_root(CFG))
        os.chmod(cls.box, 0o711)
        cls.rw = os.path.join(cls.box, "rw")
        os.mkdir(cls.rw)
        sandbox.prepare(cls.rw, CFG)

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.box, ignore_errors=True)

    def run_in(self, script, limits=sandbox.Limits(timeout=30)):
        return sandbox.run(["/bin/sh", "-c", script], self.rw, kernel_tree(CFG),
                           os.path.join(self.box, "log"), limits, cfg=CFG)

    def test_a_private_folder_is_named(self):
        """A kit under a folder others cannot enter (a clone in /root): the probe
        fails and names that folder, instead of bubblewrap's bare Permission denied."""
        private = os.path.join(self.box, "private")
        tree = os.path.join(private, "tree")
        os.makedirs(tree)
        os.chmod(private, 0o700)
        ok, why = sandbox.probe([tree], os.path.join(self.box, "scratch"),
                                Config.from_env(confine="bubblewrap"))
        self.assertFalse(ok)
        self.assertIn(f"{private} is private", why)

    def test_view(self):
        probes = {
            "uid": "id -u",
            # (By its real path, the one the sandbox shows: build/kernel may be a link.)
            "kernel tree readable": f"test -r {os.path.realpath(TREE.obj)}/Makefile && echo yes",
            "kernel tree read-only": f"touch {os.path.realpath(TREE.obj)}/x 2>/dev/null "
                                     f"|| echo refused",
            "kit hidden": f"test -e {ROOT}/labs || echo hidden",
            "solutions hidden": f"ls {LAB}/solutions 2>/dev/null || echo hidden",
            "made solutions hidden": f"ls {os.path.dirname(solution_file())} 2>/dev/null "
                                     "|| echo hidden",
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
        want = {"uid": str(CFG.sandbox_uid), "kernel tree readable": "yes",
                "kernel tree read-only": "refused", "kit hidden": "hidden",
                "solutions hidden": "hidden", "made solutions hidden": "hidden",
                "host files hidden": "hidden",
                "no /proc": "none", "no /home, /root, /tmp": "none", "writable folder": "yes",
                "stdin is /dev/null": "eof", "no network": "lo\n101",    # only lo; ENETUNREACH
                "no more user namespaces": "refused"}
        if self.level == "jail":
            # Not a namespace of its own: the container's interfaces are there,
            # and the seccomp filter refuses the socket.
            probes["no network"] = ("/usr/bin/python3 -c \"import socket\ntry:\n"
                                    " socket.socket()\nexcept OSError as e:\n print(e.errno)\"")
            want["no network"] = "1"                                  # EPERM
            want["uid"] = str(Config.from_env().jail_uid)           # slot 0's
        for label, script in probes.items():
            with self.subTest(label):
                res = self.run_in(script)
                self.assertEqual(res.output.strip(), want[label], str(res))
                self.assertEqual(res.level, self.level)

    def test_no_user_namespaces_with_an_older_bubblewrap(self):
        """bubblewrap 0.6 (Ubuntu 22.04, Gradescope's base) has no --disable-userns:
        the seccomp filter that stands in for it refuses new user namespaces and
        leaves processes, threads and posix_spawn (clone3 -> clone) working."""
        if self.level != "bubblewrap":
            self.skipTest(f"bubblewrap's filter; builds run in the {self.level} here")
        saved = sandbox._disable_userns
        sandbox._disable_userns = False
        try:
            self.assertIn("--seccomp", sandbox.bwrap_args(self.rw, [], cfg=CFG, seccomp_fd=3))
            cases = {
                "unshare -U": ("unshare -U true 2>&1 || echo refused",
                               "unshare: unshare failed: Operation not permitted\nrefused"),
                "unshare -r": ("unshare -r true 2>/dev/null || echo refused", "refused"),
                "fork and spawn": ("(true) & wait; /usr/bin/python3 -c \"import subprocess, "
                                   "threading; t = threading.Thread(target=print); t.start(); "
                                   "t.join(); print(subprocess.run(['true']).returncode)\"",
                                   "\n0"),
            }
            for label, (script, want) in cases.items():
                with self.subTest(label):
                    res = self.run_in(script)
                    self.assertEqual(res.output.strip("\n"), want.strip("\n"), str(res))
        finally:
            sandbox._disable_userns = saved

    def test_unprivileged_outside_too(self):
        """A mapped root would still be kuid 0 to the host (and exempt from NPROC)."""
        res = self.run_in("touch /build/owner")
        self.assertEqual(res.status, "ok", str(res))
        st = os.stat(os.path.join(self.rw, "owner"))
        expect = CFG.sandbox_uid if os.geteuid() == 0 else os.geteuid()
        if self.level == "jail":
            expect = Config.from_env().jail_uid                     # slot 0's
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
        # (Only bubblewrap tried: as root, the jail would work.)
        env = {**os.environ, "PATH": "/usr/bin:/bin", "MMIOLAB_CONFINE": "bubblewrap"}
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
            # Allowed: it builds (here the starter, with a syntax error) and says so.
            broken = os.path.join(out, "broken.c")
            with open(broken, "w") as f:
                f.write(starter().replace("static int ringdrv_probe", "static int oops", 1))
            code = code.replace(repr(os.path.join(LAB, "starter", "ringdrv.c")), repr(broken))
            res = subprocess.run(["/usr/bin/python3", "-c", code, "--out", out,
                                  "--allow-unconfined-build"], capture_output=True, text=True,
                                 env=env, timeout=300)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            with open(os.path.join(out, "broken", "summary.txt")) as f:
                summary = f.read()
            with open(os.path.join(out, "broken", "instructor.txt")) as f:
                self.assertIn("flagged for the instructor: the build ran unconfined", f.read())
            self.assertNotIn("flagged", summary)       # flags are the instructor's
            self.assertIn("oops", summary)             # the compiler ran, unconfined
            self.assertNotIn(ROOT, summary)


class JailTest(unittest.TestCase):
    """The jail (jail.py), forced whatever the probe would pick: what it keeps
    a step from doing. Needs root, as the jail does."""

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("the jail needs root")
        cls.cfg = Config.from_env(confine="jail")
        cls.level, why = sandbox.probe(kernel_tree(cls.cfg), scratch_root(cls.cfg), cls.cfg)
        if cls.level != "jail":
            raise AssertionError(f"the jail does not work here: {why}")
        cls.box = tempfile.mkdtemp(prefix="jail-test-", dir=scratch_root(CFG))
        os.chmod(cls.box, 0o711)
        cls.secret = os.path.join(cls.box, "secret")
        with open(cls.secret, "w") as f:
            f.write("the answer\n")
        os.chmod(cls.secret, 0o644)             # readable by anyone who can reach it

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.box, ignore_errors=True)

    def run_in(self, script, limits=sandbox.Limits(timeout=30), python=False):
        rw = tempfile.mkdtemp(dir=self.box)
        sandbox.prepare(rw, self.cfg)
        argv = ["/usr/bin/python3", "-c", script] if python else ["/bin/sh", "-c", script]
        return sandbox.run(argv, rw, kernel_tree(self.cfg), os.path.join(rw + ".log"), limits,
                           cfg=self.cfg)

    def test_ids_and_privileges(self):
        """The jail's own uid and gid, no groups, no_new_privs, a seccomp filter."""
        res = self.run_in("import ctypes, os\nlibc = ctypes.CDLL(None)\n"
                          "print(os.getresuid(), os.getresgid(), os.getgroups(), "
                          "libc.prctl(39, 0, 0, 0, 0), libc.prctl(21, 0, 0, 0, 0))", python=True)
        uid, gid = self.cfg.jail_uid, self.cfg.jail_gid         # slot 0: nothing else runs
        self.assertEqual(res.output.strip(), f"{(uid,) * 3} {(gid,) * 3} [] 1 2", str(res))
        self.assertEqual(res.level, "jail")

    def test_cannot_read_outside(self):
        trees = kernel_tree(self.cfg)
        probes = ["/proc", "/root", "/home", "/tmp", ROOT, BUILD]
        # The kit's folders exist in the jail only where the kernel tree lies
        # below them (a kit whose build/ holds the kernel): then each shows
        # nothing but the next folder on the way to it.
        on_the_way = {p: sorted({t[len(p) + 1:].split("/")[0] for t in trees
                                 if t.startswith(p + "/")}) for p in probes}
        res = self.run_in(f"cat {self.secret} {solution_file()} {SOLUTION_PATCH} /etc/passwd "
                          f"2>/dev/null; for p in {' '.join(probes)}; do "
                          f"test -e $p && echo $p: $(ls -A $p); done; echo --; ls /")
        self.assertNotIn("the answer", res.output)
        self.assertNotIn("mmiowb();", res.output)
        found, _, listing = res.output.partition("--\n")
        self.assertEqual(found.splitlines(), [f"{p}: {' '.join(on_the_way[p])}" for p in probes
                                              if on_the_way[p]], str(res))
        tops = {t for t in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
                if os.path.lexists("/" + t)}
        tops |= {p.split("/")[1] for p in trees}            # the kernel tree's path
        self.assertEqual(sorted(listing.split()),
                         sorted(tops | {"build", "dev", "etc", "usr"}), str(res))

    def test_no_network(self):
        """Every socket but AF_UNIX is refused (the jail shares the host's or the
        container's network namespace: the filter is what keeps it off)."""
        res = self.run_in("import socket\nfor fam in (socket.AF_INET, socket.AF_INET6, "
                          "socket.AF_NETLINK, socket.AF_PACKET, socket.AF_UNIX):\n"
                          " try:\n  socket.socket(fam, socket.SOCK_DGRAM if fam != "
                          "socket.AF_PACKET else socket.SOCK_RAW).close(); print('open')\n"
                          " except OSError as e:\n  print(e.errno)", python=True)
        self.assertEqual(res.output.split(), ["1", "1", "1", "1", "open"], str(res))

    def test_no_ptrace_no_namespaces_no_mounts(self):
        calls = {"ptrace": (101, 0, 0, 0, 0),                    # PTRACE_TRACEME
                 "process_vm_readv": (310, 1, 0, 0, 0, 0, 0),
                 "unshare_user": (272, 0x10000000), "unshare_net": (272, 0x40000000),
                 "clone3": (435, 0, 0), "setns": (308, 0, 0), "chroot": (161, 0),
                 "mount": (165, 0, 0, 0, 0, 0), "bpf": (321, 0, 0, 0),
                 "io_uring_setup": (425, 1, 0), "keyctl": (250, 0, 0, 0, 0, 0),
                 "perf_event_open": (298, 0, 0, 0, 0, 0), "x32_getpid": (0x40000000 | 39,)}
        code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "libc.syscall.restype = ctypes.c_long\n"
                f"for name, (nr, *a) in {calls!r}.items():\n"
                " r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])\n"
                " print(f'{name}={0 if r >= 0 else ctypes.get_errno()}')\n")
        res = self.run_in(code, python=True)
        got = dict(line.split("=") for line in res.output.split())
        want = {name: "1" for name in calls}                       # EPERM
        want["clone3"] = "38"                                      # ENOSYS: clone() instead
        self.assertEqual(got, want, str(res))
        res = self.run_in("unshare -U true 2>/dev/null || echo refused; "
                          "(true) & wait; echo forked")
        self.assertEqual(res.output.split(), ["refused", "forked"], str(res))

    def test_cannot_write_outside_its_folder(self):
        obj = os.path.realpath(TREE.obj)
        res = self.run_in(f"test -r {obj}/Makefile || echo no tree; "
                          f"for p in /x /usr/x /dev/x /etc/alternatives/x {obj}/x; do "
                          f"touch $p 2>/dev/null && echo wrote $p; done; "
                          f"echo y > /dev/null && touch /build/ok && echo ok")
        self.assertEqual(res.output.strip(), "ok", str(res))
        self.assertFalse(os.path.exists(os.path.join(obj, "x")))

    def test_killed_as_a_tree(self):
        """At the time limit every process of the step goes, those that left its
        session and process group included."""
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        try:
            res = self.run_in("setsid sleep 300 & (sleep 200 &); "
                              "/usr/bin/python3 -c 'import os; os.setpgid(0, 0); "
                              "os.system(\"sleep 100\")' & sleep 1000",
                              sandbox.Limits(timeout=3))
            self.assertEqual(res.status, "timeout", str(res))
            reap()
            self.assertEqual(descendants(), [])
            for n in range(jail.SLOTS):
                self.assertEqual(jail.processes_of(self.cfg.jail_uid + n), [])
            # A step that ends leaving processes behind: they go too.
            res = self.run_in("setsid sleep 300 & echo left")
            self.assertEqual(res.status, "ok", str(res))
            reap()
            self.assertEqual(descendants(), [])
        finally:
            prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

    def test_one_step_cannot_signal_another(self):
        """Concurrent steps run as different uids: kill -9 -1 in one leaves the other."""
        import threading
        results = {}
        first = threading.Thread(target=lambda: results.update(
            a=self.run_in("sleep 4; echo alive")))
        first.start()
        time.sleep(1.5)
        results["b"] = self.run_in("kill -9 -1; echo sent")
        first.join()
        self.assertEqual(results["a"].output.strip(), "alive", str(results["a"]))
        self.assertEqual(results["b"].output.strip(), "sent", str(results["b"]))

    def test_landlock_scopes_abstract_sockets(self):
        """What Landlock adds inside the chroot (ABI 6): abstract UNIX sockets
        belong to the network namespace, which the jail shares; Landlock keeps
        the step from connecting to one made outside it."""
        if jail.landlock_abi() < 6:
            self.skipTest(f"Landlock ABI {jail.landlock_abi()} has no scopes")
        import socket
        name = f"mmiolab-jail-test-{os.getpid()}"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
            srv.bind("\0" + name)
            srv.listen()
            res = self.run_in(f"import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
                              f" s.connect('\\0{name}'); print('connected')\n"
                              f"except OSError as e:\n print(e.errno)", python=True)
        self.assertEqual(res.output.strip(), "1", str(res))                     # EPERM


# ---------------------------------------------------------------------------- corpus

PROBE_END = "\tdev_info(dev, \"ring of %d descriptors, irq %d\\n\", RING_ENTRIES, irq);\n"
IOCTL_START = "\tswitch (op) {\n\tcase RINGDRV_SUBMIT:\n"
INCLUDES_END = '#include "ringdrv_ioctl.h"\n'
MISC_START = "\trd->misc.minor = MISC_DYNAMIC_MINOR;\n"


def starter() -> str:
    with open(os.path.join(LAB, "starter", "ringdrv.c")) as f:
        return f.read()


def solution() -> str:
    with open(solution_file()) as f:
        return f.read()


def probe_adds(code: str, head: str = "", tail: str = "", decl: str = "") -> str:
    """The starter with `code` at the end of probe(), `head` before it, `decl` after
    its #includes, `tail` after it."""
    s = starter()
    assert PROBE_END in s and INCLUDES_END in s
    s = s.replace(INCLUDES_END, INCLUDES_END + decl, 1)
    return head + s.replace(PROBE_END, PROBE_END + code, 1) + tail


def asm_in_probe(asm: str) -> str:
    return probe_adds(f"\tasm volatile({json.dumps(asm)});\n")


THIEF = r"""
#include <linux/sched.h>
#include <linux/mm_types.h>

/* Look for the run's nonce where the issue found it: the caller's argv and
 * environment (insmod's, then the test program's). */
static void thief(const char *who)
{
	static char buf[4096];
	struct mm_struct *mm = current->mm;
	unsigned long start, end, n, i, run;
	int r;

	if (!mm)
		return;
	for (r = 0; r < 2; r++) {
		start = r ? mm->env_start : mm->arg_start;
		end = r ? mm->env_end : mm->arg_end;
		n = end - start < sizeof(buf) ? end - start : sizeof(buf) - 1;
		if (copy_from_user(buf, (void __user *)start, n))
			continue;
		for (i = 0, run = 0; i < n; i++) {
			char c = buf[i];

			if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))
				run++;
			else
				run = 0;
			if (run >= 16 || (i >= 5 && buf[i - 5] == 'N' && buf[i - 4] == 'O' &&
					 buf[i - 3] == 'N' && buf[i - 2] == 'C' &&
					 buf[i - 1] == 'E' && c == '=')) {
				pr_emerg("THIEF %s: FOUND %.40s\n", who, buf + i - (run >= 16 ? 15 : 5));
				return;
			}
		}
	}
	pr_emerg("THIEF %s: nothing\n", who);
}
"""


class Case:
    def __init__(self, label, verdict, make, check=None, vm=False, sid=None):
        self.label, self.verdict, self.make, self.check, self.vm = label, verdict, make, check, vm
        self.sid = sid or re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:60]


def c_file(text):
    def make(path):
        with open(path + ".c", "w") as f:
            f.write(text)
        return path + ".c"
    return make


def zip_of(members, patch=None):
    """members: (name, bytes) or ZipInfo with bytes; patch(raw bytes) -> raw bytes."""
    def make(path):
        with zipfile.ZipFile(path + ".zip", "w", zipfile.ZIP_DEFLATED) as z:
            for m in members:
                z.writestr(*m)
        if patch:
            with open(path + ".zip", "rb") as f:
                raw = f.read()
            with open(path + ".zip", "wb") as f:
                f.write(patch(raw))
        return path + ".zip"
    return make


def tar_of(members, suffix=".tar.gz", mode="w:gz"):
    def make(path):
        with tarfile.open(path + suffix, mode) as t:
            for ti, data in members:
                t.addfile(ti, io.BytesIO(data) if data is not None else None)
        return path + suffix
    return make


def tinfo(name, size=0, kind=tarfile.REGTYPE, link=""):
    ti = tarfile.TarInfo(name)
    ti.size, ti.type, ti.linkname, ti.mode = size, kind, link, 0o644
    return ti


def eocd_claims_one(raw: bytes) -> bytes:
    i = raw.rfind(b"PK\x05\x06")
    return raw[:i + 8] + struct.pack("<HH", 1, 1) + raw[i + 12:]


def lying_sizes(raw: bytes) -> bytes:
    """Every size field of a one-member zip says 100 bytes."""
    loc = raw.find(b"PK\x03\x04")
    raw = raw[:loc + 22] + struct.pack("<I", 100) + raw[loc + 26:]
    cen = raw.find(b"PK\x01\x02")
    return raw[:cen + 24] + struct.pack("<I", 100) + raw[cen + 28:]


def xz_big_dictionary(path):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as t:
        src = starter().encode()
        t.addfile(tinfo("ringdrv.c", len(src)), io.BytesIO(src))
    out = subprocess.run(["xz", "--format=xz", "--lzma2=dict=1536MiB", "-c"],
                         input=data.getvalue(), capture_output=True, check=True).stdout
    with open(path + ".tar.xz", "wb") as f:
        f.write(out)
    return path + ".tar.xz"


def gz_bomb(path):
    """A tar.gz whose one member is 64 MiB of zeros (over the 32 MiB total cap)."""
    with tarfile.open(path + ".tgz", "w:gz", compresslevel=1) as t:
        size = 64 << 20
        t.addfile(tinfo("ringdrv.c", size), io.BytesIO(b"\0" * size))
    return path + ".tgz"


def folder_with_link(target):
    def make(path):
        os.makedirs(path)
        os.symlink(target, os.path.join(path, "ringdrv.c"))
        return path
    return make


def folder_named(name, text):
    """A class entry with a name of the grader's own (gradebook.csv)."""
    def make(path):
        folder = os.path.join(os.path.dirname(path), name)
        os.makedirs(folder)
        with open(os.path.join(folder, "ringdrv.c"), "w") as f:
            f.write(text)
        return folder
    return make


def relative_probe() -> str:
    lines = []
    made = os.path.relpath(solution_file(), ROOT)       # build/labs/doorbell/solutions/...
    for k in range(9):
        for rel in ("solutions/mmiowb.patch", "labs/doorbell/solutions/mmiowb.patch",
                    "doorbell/solutions/mmiowb.patch", made,
                    made.split(os.sep, 1)[1], made.split(os.sep, 2)[2]):
            p = "../" * k + rel
            lines += [f'#{"if" if not lines else "elif"} __has_include("{p}")', f'#include "{p}"']
    return "\n".join(lines) + '\n#else\n#error "no solution visible"\n#endif\n'


def expansion_bomb() -> str:
    out = ["#define A0 1"] + [f"#define A{i} A{i - 1},A{i - 1}" for i in range(1, 41)]
    return "\n".join(out) + "\nint bomb[] = { A40 };\n"


def message_bomb() -> str:
    out = ['#define M0 _Pragma("message \\"flood flood flood flood flood flood flood\\"")']
    out += [f"#define M{i} " + " ".join([f"M{i - 1}"] * 10) for i in range(1, 7)]
    return "\n".join(out) + "\nM6\n"


def no_text(*needles):
    """A check: none of these strings in what the student sees."""
    def check(t, doc, summary, out_dir):
        seen = json.dumps(doc) + summary
        for n in needles:
            t.assertNotIn(n, seen)
    return check


def says(*words):
    def check(t, doc, summary, out_dir):
        for w in words:
            t.assertIn(w, summary)
    return check


def flagged(*words):
    """Flags are the instructor's (issue 33): in instructor.txt, never in the
    student's summary or results.json."""
    def check(t, doc, summary, out_dir):
        with open(os.path.join(out_dir, "instructor.txt")) as f:
            mine = f.read()
        for w in words:
            t.assertIn(w, mine)
            t.assertNotIn(w, summary)
            t.assertNotIn(w, json.dumps(doc))
    return check


def not_flagged(*words):
    def check(t, doc, summary, out_dir):
        with open(os.path.join(out_dir, "instructor.txt")) as f:
            mine = f.read()
        for w in words:
            t.assertNotIn(w, mine)
    return check


def says_one_of(*words):
    """A check for a bomb that trips whichever limit comes first (the
    compiler's memory on 6.12, the build's time on 6.1): the summary says which."""
    def check(t, doc, summary, out_dir):
        t.assertTrue(any(w in summary for w in words), summary)
    return check


def console_says(*words):
    def check(t, doc, summary, out_dir):
        with open(os.path.join(out_dir, "console.log"), errors="replace") as f:
            console = f.read()
        for w in words:
            t.assertIn(w, console)
        with open(os.path.join(out_dir, "channel.log"), errors="replace") as f:
            nonce = f.readline().split(" ", 1)[0]
        t.assertGreaterEqual(len(nonce), 32)
        t.assertNotIn(nonce, console, "the nonce reached the console")
        with open(os.path.join(out_dir, "qemu.cmd")) as f:
            t.assertNotIn(nonce, f.read(), "the nonce is on the kernel command line")
    return check


def scores(**want):
    def check(t, doc, summary, out_dir):
        got = {x["name"]: x["score"] for x in doc["tests"]}
        for k, v in want.items():
            # The summary says why (an rmmod's error, say): the output folder
            # is gone after the test.
            t.assertEqual(got[k], v, f"{k}: {got}\n{summary}")
    return check


def all_of(*checks):
    def check(*a):
        for c in checks:
            c(*a)
    return check


def corpus() -> list[Case]:
    sol = solution_file()
    shadow_like = "root:"
    C = [
        # -- intake: crafted archives
        Case("zip whose end record claims 1 entry, 600 in its directory", "too-many-members",
             zip_of([(f"f{i}", b"x") for i in range(600)] + [("ringdrv.c", starter())],
                    eocd_claims_one)),
        Case("tar.xz whose header asks for a 1.5 GiB dictionary", "archive-too-large",
             xz_big_dictionary),
        Case("tar.gz bomb: one member of 64 MiB of zeros", "archive-too-large", gz_bomb),
        Case("zip whose local header says ../../x.c where the directory says ringdrv.c",
             "unreadable", zip_of([("ringdrv.c", starter())],
                                  lambda raw: raw.replace(b"ringdrv.c", b"../../x.c", 1))),
        Case("zip whose size fields lie (100 bytes; 1 MiB inflated)", "unreadable",
             zip_of([("ringdrv.c", starter() + "/*" + "x" * (1 << 20) + "*/")], lying_sizes)),
        Case("zip with ringdrv.c as a symbolic link to the solution", "symlink",
             zip_of([(_link_info("ringdrv.c"), sol)])),
        Case("tar with ringdrv.c a hard link to the kit's solution", "hardlink",
             tar_of([(tinfo("ringdrv.c", kind=tarfile.LNKTYPE, link=sol), None)])),
        Case("folder whose ringdrv.c links to /dev/zero", "symlink", folder_with_link("/dev/zero")),
        Case("ringdrv.c that is really a zip (polyglot)", "binary-file",
             lambda p: _zip_named_c(p)),
        Case("ringdrv.c only inside a zip inside the zip", "missing-file",
             zip_of([("inner.zip", _zip_bytes([("ringdrv.c", starter())]))])),
        # -- build: reading the kit and the host
        Case("#include the solution by relative paths, probed with __has_include",
             "build-failed", c_file(relative_probe()), says("no solution visible")),
        Case("#include the solution by absolute path", "build-failed",
             c_file(f'#include "{sol}"\n'), no_text("mmiowb();")),
        Case("#include the solution's patch by absolute path", "build-failed",
             c_file(f'#include "{SOLUTION_PATCH}"\n'), no_text("mmiowb();", "Solution (")),
        Case("#include </etc/shadow>", "build-failed", c_file("#include </etc/shadow>\n"),
             no_text(shadow_like)),
        Case(".incbin the solution and print it from probe()", "build-failed",
             c_file(probe_adds('\tpr_err("%s", leaked);\n',
                               head=f'asm(".section .rodata\\n.globl leaked\\nleaked:\\n'
                                    f'.incbin \\"{sol}\\"\\n.byte 0\\n.previous");\n'
                                    f'extern const char leaked[];\n')),
             no_text("mmiowb();")),
        Case(".incbin /etc/passwd", "build-failed",
             c_file(probe_adds("", head='asm(".section .rodata\\n.incbin \\"/etc/passwd\\"\\n'
                                        '.previous");\n')), no_text("root:x:0:0")),
        Case("#include /proc/self/environ", "build-failed",
             c_file('#include "/proc/self/environ"\n')),
        Case("#include /dev/stdin (the grader's stdin)", "build-failed",
             c_file('#include "/dev/stdin"\nthis is not C;\n')),
        Case("kallsyms_lookup_name (not exported: modpost refuses)", "build-failed",
             c_file(probe_adds('\tpr_info("%lx", kallsyms_lookup_name("mmiosim_flush"));\n',
                               head="unsigned long kallsyms_lookup_name(const char *name);\n"))),
        # -- build: bombs
        Case("#include __FILE__ twice per level (2^200 inclusions)", "build-failed",
             c_file("#if __INCLUDE_LEVEL__ < 190\n#include __FILE__\n#include __FILE__\n#endif\n"),
             says_one_of("did not finish", "ran out of memory")),
        Case("macro expansion bomb (2^40 tokens)", "build-failed", c_file(expansion_bomb())),
        Case("a 1 GiB initialized array (object file over the size limit)", "build-failed",
             c_file(probe_adds("\tpr_info(\"%d\", big[irq]);\n",
                               head="static char big[1u << 30] = { 1 };\n"))),
        Case("a million #pragma message (output bomb)", "build-failed", c_file(message_bomb()),
             says("printed more than")),
        # -- symbols
        Case("weak import with __attribute__((weak))", "forbidden-symbols",
             c_file(probe_adds("\tif (mmiosim_flush)\n\t\tmmiosim_flush();\n",
                               head="#include <linux/mmiosim.h>\nextern void mmiosim_flush(void)"
                                    " __attribute__((weak));\n",
                               tail="MODULE_IMPORT_NS(MMIOSIM);\n")), says("mmiosim_flush")),
        Case("weak import with #pragma weak", "forbidden-symbols",
             c_file(probe_adds("\tif (mmiosim_flush)\n\t\tmmiosim_flush();\n",
                               head="#include <linux/mmiosim.h>\n#pragma weak mmiosim_flush\n",
                               tail="MODULE_IMPORT_NS(MMIOSIM);\n")), says("weak")),
        Case("weak import of an allowed symbol (msleep)", "forbidden-symbols",
             c_file(probe_adds("\tmsleep(1);\n", head="#include <linux/delay.h>\n"
                                                     "#pragma weak msleep\n")), says("msleep")),
        Case("asm label: sneaky_flush() is mmiosim_flush", "forbidden-symbols",
             c_file(probe_adds("\tsneaky_flush();\n",
                               head='extern void sneaky_flush(void) asm("mmiosim_flush");\n',
                               tail="MODULE_IMPORT_NS(MMIOSIM);\n")), says("mmiosim_flush")),
        Case("an absolute symbol at a fixed address, then called", "forbidden-symbols",
             c_file(probe_adds("\tfixed_fn();\n",
                               head='asm(".globl fixed_fn\\n.set fixed_fn, 0xffffffff81000000");'
                                    '\nextern void fixed_fn(void);\n')), says("absolute")),
        Case("kernel-thread fork bomb", "forbidden-symbols",
             c_file(probe_adds("\tfor (;;)\n\t\tkthread_run(bomb, NULL, \"bomb\");\n",
                               head="#include <linux/kthread.h>\nstatic int bomb(void *d) "
                                    "{ for (;;) kthread_run(bomb, d, \"bomb\"); return 0; }\n")),
             says("kthread_create_on_node")),
        Case("user-mode helper fork bomb", "forbidden-symbols",
             c_file(probe_adds('\t{\n\t\tchar *argv[] = { "/bin/sh", "-c", ":(){ :|:& };:", NULL };'
                               '\n\t\tcall_usermodehelper(argv[0], argv, NULL, UMH_NO_WAIT);\n\t}\n',
                               head="#include <linux/umh.h>\n")), says("call_usermodehelper")),
        Case("read /proc/cmdline from saved_command_line (not exported)", "build-failed",
             c_file(probe_adds('\tpr_err("%s", saved_command_line);\n',
                               head="#include <linux/init.h>\n")), says("saved_command_line")),
        Case("open /job/nonce with filp_open", "forbidden-symbols",
             c_file(probe_adds('\tfilp_close(filp_open("/job/nonce", O_RDONLY, 0), NULL);\n',
                               head="#include <linux/fs.h>\n")), says("filp_open")),
        # -- code
        Case("the issue's exploit: nonce from insmod's environment, KTAP by outb, "
             "isa-debug-exit", "forbidden-code",
             c_file(probe_adds('\tthief("insmod");\n\toutb(\'o\', 0x2f8);\n\toutb(0, 0xf4);\n',
                               decl=THIEF)), says("port I/O")),
        Case("port I/O hidden as raw bytes", "forbidden-code", c_file(asm_in_probe(
            ".byte 0xe6, 0xf4")), says("port I/O")),
        Case("wrmsr", "forbidden-code", c_file(probe_adds(
            '\tasm volatile("wrmsr" : : "c"(0x10), "a"(0), "d"(0));\n')), says("MSR")),
        Case("clear CR0.WP to write kernel text", "forbidden-code", c_file(probe_adds(
            '\t{\n\t\tunsigned long cr0;\n\t\tasm volatile("mov %%cr0, %0" : "=r"(cr0));\n'
            '\t\tasm volatile("mov %0, %%cr0" : : "r"(cr0 & ~0x10000UL));\n\t}\n')),
             says("control or debug register")),
        Case("int $0x80 from ring 0", "forbidden-code", c_file(asm_in_probe("int $0x80")),
             says("software interrupt")),
        Case("hlt", "forbidden-code", c_file(asm_in_probe("hlt")), says("hlt")),
        Case("vmcall (a hypercall to QEMU)", "forbidden-code", c_file(asm_in_probe("vmcall")),
             says("hypercall")),
        Case("sidt (the IDT's address: the kernel's base)", "forbidden-code", c_file(probe_adds(
            '\t{\n\t\tstruct { u16 limit; u64 base; } __packed idt;\n'
            '\t\tasm volatile("sidt %0" : "=m"(idt));\n\t\tpr_info("%llx", idt.base);\n\t}\n')),
             says("descriptor tables")),
        Case("call a constant kernel address", "forbidden-code", c_file(probe_adds(
            "\t((void (*)(void))0xffffffff81234560UL)();\n")), says("constant kernel address")),
        Case("indirect call through a fixed address", "forbidden-code",
             c_file(asm_in_probe("call *0xffffffff81000000")), says("fixed address")),
        Case("jump into the middle of an instruction (hidden out)", "forbidden-code",
             c_file(asm_in_probe("jmp 1f+1\n1: .byte 0xb8, 0xe6, 0xf4, 0x90, 0x90")),
             says("middle of an instruction")),
        Case("300 KiB of code", "forbidden-code", c_file(probe_adds(
            "", head='asm(".pushsection .text.big, \\"ax\\"\\n.fill 300000, 1, 0x90\\n'
                     '.popsection");\n')), says("bytes of code")),
        Case("a writable and executable section", "forbidden-code", c_file(probe_adds(
            "", head='asm(".pushsection .wx, \\"awx\\"\\n.byte 0xc3\\n.popsection");\n')),
             says("writable and executable")),
        Case("a student id that is the gradebook's name", "build-failed",
             folder_named("gradebook.csv", "not C at all\n"), says("gradebook.csv~2")),
        # -- run in the guest
        Case("nonce thief: insmod's and the test program's argv and environment", "graded",
             c_file(probe_adds('\tthief("insmod");\n', decl=THIEF).replace(
                 IOCTL_START, '\tif (!READ_ONCE(stolen)) {\n\t\tWRITE_ONCE(stolen, 1);\n'
                              '\t\tthief("ringtest");\n\t}\n' + IOCTL_START, 1).replace(
                 "static void thief", "static int stolen;\nstatic void thief", 1)),
             console_says("THIEF insmod: nothing", "THIEF ringtest: nothing"), vm=True),
        # (The racy starter fails its race test in nearly every run, not every one: the
        # cases below fail, or not, in ways that do not depend on it.)
        Case("forged KTAP and a forged end line on the console, then no driver", "graded",
             c_file(starter().replace(MISC_START, '\tpr_emerg("KTAP version 1\\n1..4\\n'
                                      'ok 1 load_unload\\nok 2 single_cpu\\nok 3 race\\n'
                                      'ok 4 cost\\n0123456789abcdef0123456789abcdef # mmiolab'
                                      ' harness: end\\n");\n\treturn -ENODEV;\n' + MISC_START,
                                      1)),
             scores(load_unload=0, single_cpu=0, race=0, cost=0), vm=True),
        Case("return address and an indirect call: runs, flagged", "graded",
             c_file(probe_adds('\tpr_info("called from %px\\n", __builtin_return_address(0));'
                               '\n\thook();\n',
                               head="static void noop(void) { }\n"
                                    "static void (*volatile hook)(void) = noop;\n")),
             all_of(scores(load_unload=10), flagged("indirect calls",
                                                    "__builtin_return_address")),
             vm=True),
        Case("the solution in a zip full of traversal, build files and junk", "graded",
             zip_of([("student/ringdrv.c", solution()), ("../../../../tmp/mmiolab-pwned", "x"),
                     ("/etc/cron.d/mmiolab-pwned", "x"), ("student/Makefile", "all:\n\trm -rf /\n"),
                     ("__MACOSX/student/._ringdrv.c", "junk")]),
             all_of(scores(race=labspec.load_lab("doorbell").test("race").points, cost=10),
                    says("path-traversal", "absolute-path")), vm=True),
    ]
    return C


def _link_info(name):
    zi = zipfile.ZipInfo(name)
    zi.create_system = 3
    zi.external_attr = (stat.S_IFLNK | 0o777) << 16
    return zi


def _zip_bytes(members):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for m in members:
            z.writestr(*m)
    return buf.getvalue()


def _zip_named_c(path):
    with open(path + ".c", "wb") as f:
        f.write(_zip_bytes([("ringdrv.c", starter())]))
    return path + ".c"


class CorpusTest(unittest.TestCase):
    """Each hostile submission gets its verdict; no process outlives the grading;
    nothing outside the scratch and output folders changes; what a student sees
    names no host path."""

    @classmethod
    def setUpClass(cls):
        for path in (TREE.bzimage, os.path.join(BUILD, "initramfs", "base.cpio.gz")):
            if not os.path.exists(path):
                raise AssertionError(f"{path} missing: run 'make kernel initramfs' first")
        ok, why = confinement(CFG)
        if not ok:
            raise AssertionError(f"builds cannot be confined on this machine: {why}")
        cls.tmp = tempfile.mkdtemp(prefix="hostile-", dir=BUILD)
        cls.klass = os.path.join(cls.tmp, "class")
        cls.out = os.path.join(cls.tmp, "out")
        cls.sentinel = os.path.join(cls.tmp, "sentinel")
        os.makedirs(cls.klass)
        os.makedirs(cls.sentinel)
        with open(os.path.join(cls.sentinel, "keep.txt"), "w") as f:
            f.write("do not touch\n")
        cls.cases = corpus()
        paths = {c.make(os.path.join(cls.klass, c.sid)): c for c in cls.cases}
        spec = labspec.load_lab("doorbell")
        # Ids as scripts/grade gives them (the gradebook.csv case must get another).
        cls.entries = entries_for(spec, [cls.klass])
        for sid, path in cls.entries:
            paths[path].sid = sid
        cls.entries = [next(e for e in cls.entries if e[0] == c.sid) for c in cls.cases]
        # Bombs run until the build timeout: keep it short here.
        cls.spec = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits,
                                                                        build_timeout=20))
        # What a hostile build would want to change (the answers), what it was
        # given (the class folder), and a bystander. (Not all of labs/: others
        # may be editing it while the suite runs.)
        watched = [cls.klass, cls.sentinel, os.path.dirname(solution_file())] + [
            os.path.join(ROOT, "labs", lab, d) for lab in labspec.lab_names()
            for d in ("solutions", "fixtures")]
        cls.before = {w: tree_state(w) for w in watched}
        kernel_files = (os.path.join(TREE.obj, "Module.symvers"),
                        os.path.join(TREE.obj, ".config"))
        cls.kernel_before = {p: os.stat(p).st_mtime_ns for p in kernel_files}
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        cls.timing = {}
        try:
            for group in (False, True):
                todo = [e for c, e in zip(cls.cases, cls.entries) if c.vm == group]
                opts = GradeOptions(seeds=[1], out=cls.out, cfg=CFG)
                t0 = time.monotonic()
                grade_batch(cls.spec, todo, opts, jobs=2, progress=lambda line: None)
                cls.timing["guest" if group else "no guest"] = time.monotonic() - t0
                reap()
                cls.leftover = descendants()
                if cls.leftover:
                    break
        finally:
            prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        cls.after = {w: tree_state(w) for w in watched}
        cls.kernel_after = {p: os.stat(p).st_mtime_ns for p in kernel_files}

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def result(self, sid):
        with open(os.path.join(self.out, sid, "results.json")) as f:
            doc = json.load(f)
        with open(os.path.join(self.out, sid, "summary.txt")) as f:
            return doc, f.read()

    def test_corpus_is_big_and_varied(self):
        self.assertGreaterEqual(len(self.cases), 30)
        self.assertGreaterEqual(len({c.verdict for c in self.cases}), 8)
        self.assertLessEqual(sum(c.vm for c in self.cases), 5, "most are stopped before a guest")

    def test_each_verdict(self):
        rows = []
        for c in self.cases:
            with self.subTest(c.label):
                doc, summary = self.result(c.sid)
                extra = doc["extra_data"]["mmiolab"]
                rows.append(f"{c.label[:70]:70} {extra['verdict']:18} "
                            f"{extra['execution_time']:5.1f}s")
                self.assertEqual(extra["verdict"], c.verdict, summary)
                if c.verdict != "graded":
                    self.assertEqual(doc["score"], 0, summary)
                if c.check:
                    c.check(self, doc, summary, os.path.join(self.out, c.sid))
        report("hostile corpus (submission, verdict, seconds):\n     " + "\n     ".join(rows)
               + "\n     batches: " + ", ".join(f"{k} {v:.0f}s" for k, v in self.timing.items()))

    def test_no_process_outlives_a_build_or_a_run(self):
        self.assertEqual(self.leftover, [])

    def test_reports_name_the_confinement(self):
        """Each result names the level that confined its build: the probe's (or
        none, for a submission refused before any build)."""
        level = confinement(CFG).level
        seen = set()
        for c in self.cases:
            doc, summary = self.result(c.sid)
            seen.add(doc["extra_data"]["mmiolab"]["confinement"])
        self.assertEqual(seen, {"", level})

    def test_nothing_outside_scratch_changed(self):
        for w in self.before:
            self.assertEqual(self.before[w], self.after[w], w)
        self.assertEqual(self.kernel_before, self.kernel_after)
        for p in ("/tmp/mmiolab-pwned", "/etc/cron.d/mmiolab-pwned",
                  os.path.join(self.tmp, "x.c")):
            self.assertFalse(os.path.lexists(p), p)
        self.assertEqual(sorted(os.listdir(self.out)),
                         sorted(["gradebook.csv"] +
                                [c.sid for c in self.cases]))

    def test_student_outputs_name_no_host_path(self):
        for c in self.cases:
            for name in ("results.json", "summary.txt", "junit.xml"):
                with open(os.path.join(self.out, c.sid, name)) as f:
                    text = f.read()
                if name == "results.json":
                    # The diff against the starter is the student's own text
                    # (a case that .incbin's a host path wrote that path).
                    doc = json.loads(text)
                    doc["extra_data"]["mmiolab"].pop("diff", None)
                    text = json.dumps(doc)
                for host in (ROOT, BUILD, self.tmp, TREE.src):
                    with self.subTest(c.label, file=name, path=host):
                        self.assertNotIn(host, text)

    def test_gradebook_has_every_row(self):
        import csv
        with open(os.path.join(self.out, "gradebook.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(sorted(r["student"] for r in rows), sorted(c.sid for c in self.cases))


# ---------------------------------------------------------------------------- issue 24

DOORBELL_WRITE = "\twritel(rd->tail, rd->regs + MMIOSIM_RING_DOORBELL);\n"


def post_adds(code: str, decl: str = "", base: str | None = None) -> str:
    """The starter (or base) with `code` after the doorbell write in
    ringdrv_post() -- inside the function a fix touches -- run once, and `decl`
    after the #includes."""
    s = starter() if base is None else base
    assert s.count(DOORBELL_WRITE) == 1 and INCLUDES_END in s
    once = ("\t{\n\t\tstatic int once;\n\n\t\tif (!once) {\n\t\t\t{\n"
            + "".join("\t\t\t" + line + "\n" for line in code.strip("\n").split("\n"))
            + "\t\t\t}\n\t\t\tonce = 1;\n\t\t}\n\t}\n")
    s = s.replace(INCLUDES_END, INCLUDES_END + decl, 1)
    return s.replace(DOORBELL_WRITE, DOORBELL_WRITE + once, 1)


def solution_probe_adds(code: str) -> str:
    s = solution()
    assert PROBE_END in s
    return s.replace(PROBE_END, PROBE_END + code, 1)


def hidden_stays_hidden(secret):
    """Nothing the module printed in the hidden tests' guest is in what the
    student sees; the hidden tests' own outputs have it, and they failed (and
    so did the tests derived from them, which quote no guest output)."""
    spec = labspec.load_lab("doorbell")

    def check(t, doc, summary, out_dir):
        visible = [x["output"] for x in doc["tests"] if x["visibility"] == "visible"]
        t.assertNotIn(secret, "\n".join(visible + [doc["output"], summary]))
        hidden = [x for x in doc["tests"] if x["visibility"] != "visible"]
        t.assertTrue(hidden)
        for x in hidden:
            if spec.test(x["name"]).source == "hidden":
                t.assertIn(secret, x["output"], x["name"])
            t.assertEqual(x["score"], 0, x["name"])
        clean = next(x for x in doc["tests"] if x["name"] == "clean_log")
        t.assertEqual(clean["status"], "passed", clean["output"])
    return check


WALK_DIRECT_MAP = """
void *p = kmalloc(64, GFP_ATOMIC);
/* the rounding hidden from the constant-address check */
unsigned long base = (unsigned long)p & ~((1UL << (20 + 10)) - 1);
u64 v = 0, i;

for (i = 0; i < 8; i++)
	if (!__get_user(v, (u64 __user *)(base + i * 4096)))
		break;
pr_info("found %llx at %lx\\n", v, base);
kfree(p);
"""

WALK_CASTS = """
static volatile int shift = 30;
void *p = kmalloc(64, GFP_ATOMIC);
/* a mask made at run time: no kernel-address constant for the code check */
unsigned long base = (unsigned long)p & (~0UL << shift);

pr_info("direct map at %lx\\n", base);
kfree(p);
"""

WALK_FS = """
struct fs_struct *fs = current->fs;

pr_info("cwd of %s: %px\\n", current->comm, fs);
"""

CONSOLE_BLOWUP = """
int i;

for (i = 0; i < 400; i++)
	pr_err("ok 3 race%900s# INFO: task %s x\\n", " ", "INFO: task INFO: task");
"""


def corpus24() -> list[Case]:
    """Issue 24's classes: ring-0 memory walking, page-cache and parameter
    tampering, parser blow-ups from the console, hidden-output leaks, warnings."""
    race = labspec.load_lab("doorbell").test("race").points
    return [
        # -- stopped by the allow-list (no guest)
        Case("__get_user() scan of the direct map from a kmalloc pointer (issue 24's "
             "exploit)", "forbidden-symbols", c_file(post_adds(WALK_DIRECT_MAP)),
             says("__get_user_nocheck_8")),
        Case("__get_user() of one kernel word", "forbidden-symbols", c_file(post_adds(
            "u32 v;\n__get_user(v, (u32 __user *)rd);\npr_info(\"%x\\n\", v);")),
             says("__get_user_nocheck_4")),
        Case("__put_user() over the test program's page-cache page", "forbidden-symbols",
             c_file(post_adds("__put_user(0x2123UL, (unsigned long __user *)rd->desc);")),
             says("__put_user_nocheck_8")),
        Case("copy_from_kernel_nofault() walk", "forbidden-symbols", c_file(post_adds(
            "u64 v;\nif (!copy_from_kernel_nofault(&v, rd, sizeof(v)))\n"
            "\tpr_info(\"%llx\\n\", v);")), says("copy_from_kernel_nofault")),
        Case("switch the fabric's profile with mmiosim_set_params()", "forbidden-symbols",
             c_file(post_adds("struct mmiosim_params prm = {};\n\nmmiosim_set_params(&prm);",
                              decl="#include <linux/mmiosim.h>\n") + "MODULE_IMPORT_NS(MMIOSIM);\n"),
             says("mmiosim_set_params")),
        Case("write the fabric's debugfs params from the module", "forbidden-symbols",
             c_file(post_adds('struct file *f = filp_open("/sys/kernel/debug/mmiosim/params",'
                              " O_WRONLY, 0);\n\nif (!IS_ERR(f))\n"
                              '\tkernel_write(f, "profile=qemu\\n", 13, &f->f_pos);',
                              decl="#include <linux/fs.h>\n")), says("filp_open")),
        # -- run, and flagged for the instructor
        Case("direct-map rounding with a constant mask (the compiler's 'and' of a kernel "
             "address)", "forbidden-code", c_file(post_adds(
                 "void *p = kmalloc(64, GFP_ATOMIC);\n\n"
                 "pr_info(\"%lx\\n\", ((unsigned long)p >> 30) << 30);\nkfree(p);")),
             says("constant kernel address")),
        Case("direct-map arithmetic on a kmalloc pointer: runs, flagged", "graded",
             c_file(post_adds(WALK_CASTS)),
             flagged("kernel-memory walking? the new code uses integer casts of pointers"),
             vm=True),
        Case("current->fs (the way to /job's page cache): runs, flagged", "graded",
             c_file(post_adds(WALK_FS, decl="#include <linux/fs_struct.h>\n"
                                            "#include <linux/sched.h>\n")),
             flagged("current->fs, current->mm", "current->fs"), vm=True),
        Case("a correct fix that prints from probe(): runs, an ordinary refactor: no flag",
             "graded", c_file(solution_probe_adds('\tpr_info("probed\\n");\n')),
             all_of(scores(race=race), not_flagged("flagged for the instructor")), vm=True),
        Case("a correct fix that pokes a register from probe(): runs, flagged", "graded",
             c_file(solution_probe_adds("\twritel(0, rd->regs + MMIOSIM_RING_INT_ACK);\n")),
             flagged("changes outside the functions a fix touches", "ringdrv_probe"), vm=True),
        # -- the console and the hidden guest
        Case("a correct fix that WARNs at every load", "graded",
             c_file(solution_probe_adds("\tWARN(1, \"ringdrv: warned at load\\n\");\n")),
             all_of(scores(race=race, clean_log=0), says("warning in the console log",
                                                          "warned at load")), vm=True),
        Case("a correct fix that prints and warns in the hidden guest only", "graded",
             c_file(solution_probe_adds(
                 "\tif (num_online_cpus() == 4) {\n"
                 "\t\tpr_err(\"LEAK24 cpus=%u cmdline-and-routes\\n\", num_online_cpus());\n"
                 "\t\tWARN(1, \"LEAK24 warn\\n\");\n\t}\n")),
             all_of(scores(race=race, clean_log=10), hidden_stays_hidden("LEAK24")), vm=True),
        Case("console lines built to make the host's patterns backtrack", "graded",
             c_file(post_adds(CONSOLE_BLOWUP)), scores(race=0), vm=True),
    ]


class Integrity24Test(unittest.TestCase):
    """Issue 24's hostile submissions, graded in one batch: each gets its
    verdict and checks, the batch finishes, and every row is in the gradebook."""

    corpus = staticmethod(corpus24)

    @classmethod
    def setUpClass(cls):
        for path in (TREE.bzimage, os.path.join(BUILD, "initramfs", "base.cpio.gz")):
            if not os.path.exists(path):
                raise AssertionError(f"{path} missing: run 'make kernel initramfs' first")
        ok, why = confinement(CFG)
        if not ok:
            raise AssertionError(f"builds cannot be confined on this machine: {why}")
        cls.tmp = tempfile.mkdtemp(prefix="hostile-batch-", dir=BUILD)
        klass = os.path.join(cls.tmp, "class")
        cls.out = os.path.join(cls.tmp, "out")
        os.makedirs(klass)
        cls.cases = cls.corpus()
        paths = {c.make(os.path.join(klass, c.sid)): c for c in cls.cases}
        spec = labspec.load_lab("doorbell")
        entries = entries_for(spec, [klass])
        for sid, path in entries:
            paths[path].sid = sid
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        t0 = time.monotonic()
        try:
            grade_batch(spec, entries, GradeOptions(seeds=[1], out=cls.out, cfg=CFG), jobs=2,
                        progress=lambda line: None)
            reap()
            cls.leftover = descendants()
        finally:
            prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        cls.seconds = time.monotonic() - t0

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.tmp, ignore_errors=True)

    result = CorpusTest.result

    def test_corpus(self):
        self.assertGreaterEqual(len(self.cases), 10)

    def test_each_verdict(self):
        rows = []
        for c in self.cases:
            with self.subTest(c.label):
                doc, summary = self.result(c.sid)
                extra = doc["extra_data"]["mmiolab"]
                rows.append(f"{c.label[:70]:70} {extra['verdict']:18} {doc['score']:5.1f} "
                            f"{extra['execution_time']:5.1f}s")
                if c.verdict == GRADED_EVEN_IF_SLOW:
                    # What is checked is the visible run's: a host too busy
                    # for the hidden run's time limit does not decide it.
                    self.assertIn(extra["verdict"], ("graded", TOO_SLOW), summary)
                else:
                    self.assertEqual(extra["verdict"], c.verdict, summary)
                if c.verdict not in ("graded", GRADED_EVEN_IF_SLOW):
                    self.assertEqual(doc["score"], 0, summary)
                if c.check:
                    c.check(self, doc, summary, os.path.join(self.out, c.sid))
        report(f"{type(self).__name__} corpus (submission, verdict, score, seconds):\n     "
               + "\n     ".join(rows) + f"\n     batch: {self.seconds:.0f}s")

    def test_every_report_carries_the_diff(self):
        for c in self.cases:
            with self.subTest(c.label):
                doc, _ = self.result(c.sid)
                with open(os.path.join(self.out, c.sid, "instructor.json")) as f:
                    diff = json.load(f)["diff"]
                self.assertTrue(diff.startswith("--- starter/ringdrv.c\n+++ ringdrv.c\n"), diff)

    def test_flags_in_the_gradebook(self):
        import csv
        with open(os.path.join(self.out, "gradebook.csv")) as f:
            rows = {r["student"]: r for r in csv.DictReader(f)}
        self.assertEqual(sorted(rows), sorted(c.sid for c in self.cases))
        walker = next(c for c in self.cases if c.label.startswith("current->fs"))
        self.assertIn("kernel-memory walking?", rows[walker.sid]["flags"])

    def test_no_process_outlives_the_batch(self):
        self.assertEqual(self.leftover, [])


# ---------------------------------------------------------------------------- issue 33

def kernel_offset(name: str, base: str = "mmiosim_va_start") -> int:
    """How far the lab kernel's symbol `name` is from `base`, an allowed import
    (x86's readl()/writel() read it inline), from its System.map. KASLR moves
    the kernel image as one piece, so a module that adds this to the address
    of the import reaches `name`, as issue 33's module did."""
    where = {}
    with open(os.path.join(TREE.obj, "System.map")) as f:
        for line in f:
            addr, _, sym = line.split()
            if sym in (name, base):
                where.setdefault(sym, []).append(int(addr, 16))
    assert len(where.get(name, [])) == 1 and len(where.get(base, [])) == 1, where
    return where[name][0] - where[base][0]


def poke_model_in_post() -> str:
    """Issue 33's exploit in a fix function: one byte of the fabric's model
    (the lock semantics, 2004 -> 5.2, after which spin_unlock() orders every
    doorbell), reached from an allowed import, written without a cast."""
    return post_adds(f"""
/* the fabric's model, from the address of an allowed import */
void *model = &mmiosim_va_start;

model += {kernel_offset("settings")};
memset(model + offsetof(struct mmiosim_params, lock_2004), 0, 1);
""", decl="#include <linux/mmiosim.h>\n")


def poke_model_in_probe() -> str:
    """The same byte, written from probe() -- outside the fix functions --
    through a union, with neither a cast nor a call."""
    return probe_adds(f"""\t{{
\t\tunion {{ unsigned long *word; bool *flag; }} at = {{ &mmiosim_va_start }};

\t\tat.flag += {kernel_offset("settings")} + offsetof(struct mmiosim_params, lock_2004);
\t\t*at.flag = false;
\t}}
""", decl="#include <linux/mmiosim.h>\n")


def poke_model_from_a_kernel_pointer() -> str:
    """The byte reached from a pointer the kernel handed the driver (its misc
    device's class, in the kernel image's read-only data), with no symbol
    and no cast: what the source review sees is field accesses and a
    memcpy()."""
    return post_adds(f"""
const struct class *cls = rd->misc.this_device->class;
char *model;

memcpy(&model, &cls, sizeof(model));
model += {kernel_offset("settings", "misc_class")};
memset(model + offsetof(struct mmiosim_params, lock_2004), 0, 1);
""", decl="#include <linux/mmiosim.h>\n")


def set_model_by_address() -> str:
    """The model changed the way the kernel still allows, through the
    fabric's own mmiosim_set_params(), called at an address computed from an
    allowed import (no allow-list grants it): the harness's second reading
    of the settings shows the change."""
    return probe_adds(f"""\t{{
\t\tvoid *base = &mmiosim_va_start;
\t\tconst struct mmiosim_params *now = base + {kernel_offset("settings")};
\t\tint (*set)(const struct mmiosim_params *p) =
\t\t\t(int (*)(const struct mmiosim_params *))(base + {kernel_offset("mmiosim_set_params")});
\t\tstruct mmiosim_params p = *now;

\t\tp.lock_2004 = false;
\t\tset(&p);
\t}}
""", decl="#include <linux/mmiosim.h>\n")


def set_model_while_open() -> str:
    """The racy starter switches the fabric to the 5.2 lock semantics (after
    which spin_unlock() orders every doorbell) through mmiosim_set_params()
    at a computed address when the test opens its device, and puts the
    2004 semantics back when it closes it, before the harness reads the
    settings again: the reading alone sees nothing; the kernel's count of
    changes (patch 15) does."""
    s = starter()
    s = s.replace(INCLUDES_END, INCLUDES_END + "#include <linux/mmiosim.h>\n", 1)
    fops = "static const struct file_operations ringdrv_fops = {\n"
    assert s.count(fops) == 1
    s = s.replace(fops, f"""static void lock_rule(bool lock_2004)
{{
\tvoid *base = &mmiosim_va_start;
\tconst struct mmiosim_params *now = base + {kernel_offset("settings")};
\tint (*set)(const struct mmiosim_params *p) =
\t\t(int (*)(const struct mmiosim_params *))(base + {kernel_offset("mmiosim_set_params")});
\tstruct mmiosim_params p = *now;

\tp.lock_2004 = lock_2004;
\tset(&p);
}}

static int ringdrv_open(struct inode *inode, struct file *file)
{{
\tlock_rule(false);
\treturn 0;
}}

static int ringdrv_release(struct inode *inode, struct file *file)
{{
\tlock_rule(true);
\treturn 0;
}}

""" + fops + "\t.open = ringdrv_open,\n\t.release = ringdrv_release,\n", 1)
    return s


def zero_card_counters() -> str:
    """Issue 33's open point: the racy starter hides its race from the card's
    counters, which ringtest's verdict rests on. After each batch it puts
    the stale-doorbell and stale-descriptor counts back to what they were
    at probe, sets the executions to one per command sent, and reports the
    results of the commands it lost itself (the card's result function is
    in its header). The counters are reached from an allowed import by the
    lab kernel's own layout, without a cast; before patch 14 (the counters
    in ordinary memory) this scored 90/100 with every race test passed."""
    s = starter()
    s = s.replace(INCLUDES_END, INCLUDES_END + "#include <linux/mmiosim.h>\n", 1)
    where = f"""
static struct mmiosim_ring_counters *card_counters(void)
{{
\tvoid *base = &mmiosim_va_start;

\treturn base + {kernel_offset("sealed")};
}}

static u64 base_stale_db, base_stale_desc, base_executed;
"""
    s = s.replace("static struct ringdrv *the_ring;\n",
                  "static struct ringdrv *the_ring;\n" + where, 1)
    done = "\tkfree(reqs);\n\treturn ret;\n}\n"
    assert s.count(done) == 1
    s = s.replace(done, """\tfor (i = 0; i < queued; i++) {
\t\tif (cmds[i].status) {
\t\t\tcmds[i].status = 0;
\t\t\tcmds[i].result = mmiosim_ring_result(cmds[i].payload, cmds[i].tag);
\t\t}
\t}
\t{
\t\tstruct mmiosim_ring_counters *c = card_counters();

\t\tc->stale_doorbells = base_stale_db;
\t\tc->stale_descriptors = base_stale_desc;
\t\tc->executed = base_executed + rd->stats.submitted;
\t}
""" + done, 1)
    return s.replace(PROBE_END, PROBE_END + """\t{
\t\tstruct mmiosim_ring_counters *c = card_counters();

\t\tbase_stale_db = c->stale_doorbells;
\t\tbase_stale_desc = c->stale_descriptors;
\t\tbase_executed = c->executed;
\t}
""", 1)


# What the kernel prints when a store hits a read-only page (6.12,
# arch/x86/mm/fault.c: show_fault_oops()).
READ_ONLY_FAULT = ("#PF: supervisor write access in kernel mode",
                   "#PF: error_code(0x0003) - permissions violation")


GRADED_EVEN_IF_SLOW = "graded, or too slow in the hidden run"
# The flag of a run whose store to the fabric's model faulted.
FAULTED_STORE = ("tampered with the fabric's settings", "a store to them faulted")


def corpus33() -> list[Case]:
    """Issue 33's first point: a module that changes the fabric's settings
    must not pass unseen, wherever the change is made and however its
    address is computed."""
    race = labspec.load_lab("doorbell").test("race").points
    return [
        Case("racy starter pokes one byte of the fabric's model from ringdrv_post(): "
             "the store faults", "graded", c_file(poke_model_in_post()),
             all_of(scores(race=0), console_says(*READ_ONLY_FAULT),
                    flagged(*FAULTED_STORE)), vm=True),
        Case("racy starter pokes the model from probe() through a union: the store faults",
             "graded", c_file(poke_model_in_probe()),
             all_of(scores(race=0), console_says(*READ_ONLY_FAULT),
                    flagged(*FAULTED_STORE)), vm=True),
        Case("racy starter pokes the model from ringdrv_post(), walking from its misc "
             "device's class: the store faults", "graded",
             c_file(poke_model_from_a_kernel_pointer()),
             all_of(scores(race=0), console_says(*READ_ONLY_FAULT),
                    flagged(*FAULTED_STORE)), vm=True),
        Case("racy starter calls mmiosim_set_params() at a computed address: runs, flagged",
             GRADED_EVEN_IF_SLOW, c_file(set_model_by_address()),
             flagged("the driver tampered with the fabric's settings", "locking 2004 -> 5.2"),
             vm=True),
        Case("racy starter rewrites the card's counters after each batch and fakes its "
             "lost results: the store faults", "graded", c_file(zero_card_counters()),
             all_of(scores(race=0), console_says(*READ_ONLY_FAULT),
                    flagged("a store to the ring card's counters faulted")), vm=True),
        Case("racy starter switches to the 5.2 rule while its device is open and back "
             "when it is closed: the kernel's count of changes shows it", GRADED_EVEN_IF_SLOW,
             c_file(set_model_while_open()),
             flagged("the driver tampered with the fabric's settings",
                     "change(s) of the settings counted by the kernel"), vm=True),
        Case("a correct fix: the settings read again after each run, no flag",
             GRADED_EVEN_IF_SLOW,
             c_file(solution()),
             all_of(scores(race=race), not_flagged("tampered with the fabric's settings")),
             vm=True),
    ]


class Integrity33Test(Integrity24Test):
    """Issue 33's tampering with the fabric's settings, graded in one batch."""

    corpus = staticmethod(corpus33)

    def test_corpus(self):
        self.assertEqual(len(self.cases), 7)

    def test_flags_in_the_gradebook(self):
        import csv
        with open(os.path.join(self.out, "gradebook.csv")) as f:
            rows = {r["student"]: r for r in csv.DictReader(f)}
        self.assertEqual(sorted(rows), sorted(c.sid for c in self.cases))
        caller = next(c for c in self.cases if "computed address" in c.label)
        self.assertIn("tampered with the fabric's settings", rows[caller.sid]["flags"])
