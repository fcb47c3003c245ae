"""The guest harnesses and their one library (vm/harness-lib.sh), no guest.

Every lab's tests/harness.sh and hidden/harness.sh sources the library,
which holds the harness protocol (scripts/mmiolab/lab.py) once; a harness
that reads the nonce, tags lines or prints the end line itself fails here.
The harnesses are also run on the host against a faked guest (its paths
moved into a folder; insmod, rmmod, record and the test programs faked),
under dash: busybox sh would run its own insmod and rmmod, not the fakes,
and busybox's ash descends from dash.
"""

import glob
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import unittest

from mmiolab import ROOT, guestout, initramfs, ktap, labtest
from mmiolab.lab import END_LINE
from mmiolab.labspec import lab_names, load_lab
from kitcfg import CFG

LIB = os.path.join(ROOT, "vm", "harness-lib.sh")
DASH = shutil.which("dash")

# What only the library may do, in a harness's commands (comments aside).
PROTOCOL = [
    (re.compile(r"\bnonce\b"), "reads or uses the nonce"),
    (re.compile(r"/dev/tty|\$ch\b"), "writes on the channel"),
    (re.compile(re.escape(END_LINE)), "prints the end line"),
    (re.compile(r"\btrap\b"), "sets a trap"),
    (re.compile(r"(^\s*|[;&|(]\s*)(insmod|rmmod)\b"), "loads or unloads the driver"),
    (re.compile(r"/job/run\b"), "removes the job script"),
]

FAKES = {
    "insmod": r'''#!/bin/sh
[ -e "$T/job/nonce" ] && echo "insmod: /job/nonce still there" >> "$T/leaks"
[ -e "$T/job/run" ] && echo "insmod: /job/run still there" >> "$T/leaks"
{ echo "insmod $*"; env; } >> "$T/seen"
[ -e "$T/fail-insmod" ] && { echo "insmod: can't insert '$1': Invalid parameters" >&2; exit 1; }
m=$(basename "$1" .ko)
touch "$T/loaded/$m" "$T/dev/$m"
''',
    "rmmod": r'''#!/bin/sh
[ -e "$T/loaded/$1" ] || { echo "rmmod: can't unload '$1': No such file" >&2; exit 1; }
rm -f "$T/loaded/$1" "$T/dev/$1"
''',
    "lsmod": '#!/bin/sh\nfor m in $(ls "$T/loaded"); do echo "$m 16384 0"; done\n',
    "nproc": "#!/bin/sh\necho 2\n",
    "record": '#!/bin/sh\n{ echo "record $*"; env; } >> "$T/seen"\nexec "$@"\n',
    # A test program: KTAP for its -k and -N, at its -i indent (vm's ringtest
    # and posttest print the same shape).
    "program": r'''#!/bin/sh
{ echo "program $*"; env; } >> "$T/seen"
[ -e "$T/job/nonce" ] && echo "program: /job/nonce still there" >> "$T/leaks"
k=0 name=x indent=0 cost=
while [ $# -gt 0 ]; do
	case $1 in -k) k=$2; shift ;; -N) name=$2; shift ;; -i) indent=$2; shift ;;
	-c) cost=$2; shift ;; --) break ;; esac    # (ordercost -- COMMAND: its own -k)
	shift
done
[ -e "$T/hang" ] && { exec 2>/dev/null; sleep 10; }
case $cost in */*) echo "0 100 100 5000" >> "$cost" ;; esac    # (posttest -c: a CPU)
pad=$(printf '%*s' "$indent" "")
[ -e "$T/fail-test" ] && { echo "${pad}not ok $k $name"; exit 1; }
echo "${pad}ok $k $name"
''',
}

_PATHS = re.compile(r'(?<=[ "<=>])(/dev/ttyS1|/sys/kernel/debug/mmiosim/params|/job/|'
                    r'/lib/mmiolab/|/dev/|/sys/module/|/tmp/)')
_MOVED = {"/dev/ttyS1": "/channel", "/sys/kernel/debug/mmiosim/params": "/params"}


def moved(text: str, root: str) -> str:
    """A guest script with its paths under root. The channel becomes a file,
    written in append mode (the guest's is a serial port); a device node, a
    file that exists."""
    text = _PATHS.sub(lambda m: root + _MOVED.get(m.group(1), m.group(1)), text)
    return text.replace('> "$ch"', '>> "$ch"').replace("[ ! -c ", "[ ! -e ")


class FakeGuest:
    """A folder standing for the guest: /job, /dev, the channel, the fabric's
    params, the library in its place; the fakes on PATH."""

    def __init__(self, module: str, programs: list[str], flags: tuple[str, ...] = ()):
        self.root = tempfile.mkdtemp(prefix="fakeguest-")
        self.module = module
        for d in ("job/v", "bin", "dev", "loaded", "tmp", "lib/mmiolab",
                  f"sys/module/{module}"):
            os.makedirs(os.path.join(self.root, d))
        self.write("params", "profile=sn2 seed=1")
        self.write(f"sys/module/{module}/refcnt", "1\n")
        self.write("job/run", "the job script\n")
        self.write(f"job/{module}.ko", "")
        self.write("channel", "")
        for name, text in FAKES.items():
            self.write(f"bin/{name}", text, 0o755)
        for p in programs:
            self.write(f"job/{p}", FAKES["program"], 0o755)
        for f in flags:
            self.write(f, "")
        with open(LIB) as f:
            self.write(initramfs.HARNESS_LIB.lstrip("/"), moved(f.read(), self.root))

    def write(self, rel: str, text: str, mode: int = 0o644) -> None:
        path = os.path.join(self.root, rel)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)

    def read(self, rel: str) -> str:
        try:
            with open(os.path.join(self.root, rel)) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def run(self, script: str, env: dict[str, str], timeout: float = 60) -> None:
        self.write("job/run", moved(script, self.root), 0o755)
        e = {"PATH": f"{self.root}/bin:/usr/bin:/bin", "T": self.root, **env}
        self.result = subprocess.run([DASH, os.path.join(self.root, "job", "run")], env=e,
                                     capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def harnesses():
    for lab in lab_names():
        spec = load_lab(lab)
        yield spec, os.path.join(spec.dir, "tests", "harness.sh"), spec.ktap_tests
        yield spec, spec.hidden_harness, spec.hidden_tests


def commands(path: str) -> list[str]:
    """The harness's lines without comments (a '#' inside quotes is kept)."""
    out = []
    with open(path) as f:
        for line in f:
            if line.lstrip().startswith("#"):
                continue
            out.append(re.sub(r"\s#\s[^\"']*$", "", line.rstrip("\n")))
    return out


class LibraryTest(unittest.TestCase):
    def test_every_harness_sources_the_library_first_and_does_no_protocol(self):
        for spec, path, _ in harnesses():
            with self.subTest(harness=os.path.relpath(path, ROOT)):
                lines = [c for c in commands(path) if c.strip()]
                self.assertEqual(lines[0], f". {initramfs.HARNESS_LIB}",
                                 "a harness begins by sourcing the library")
                for line in lines[1:]:
                    for pat, what in PROTOCOL:
                        self.assertIsNone(pat.search(line), f"the harness {what}: {line!r}")

    def test_the_library_is_in_the_initramfs_with_the_hosts_end_line(self):
        with open(LIB) as f:
            text = f.read()
        self.assertIn(f'say "{END_LINE}"', text)
        entry = initramfs.base_archive(CFG).entries[initramfs.HARNESS_LIB]
        self.assertEqual(entry.data, text.encode())

    def test_the_prebuilt_initramfs_digest_covers_the_library(self):
        with tempfile.TemporaryDirectory() as tmp:
            vm_dir = os.path.join(tmp, "vm")
            shutil.copytree(initramfs.VM_DIR, vm_dir)
            saved = initramfs.VM_DIR, initramfs.GUEST_SRC
            try:
                initramfs.VM_DIR, initramfs.GUEST_SRC = vm_dir, os.path.join(vm_dir, "guest")
                before = initramfs.inputs_digest()
                with open(os.path.join(vm_dir, "harness-lib.sh"), "a") as f:
                    f.write("# changed\n")
                self.assertNotEqual(initramfs.inputs_digest(), before)
            finally:
                initramfs.VM_DIR, initramfs.GUEST_SRC = saved

    def test_a_grade_depends_on_the_library(self):
        """--resume grades again when the library changes (grade.kit_version)."""
        from mmiolab.grade import KIT_FILES
        self.assertIn(LIB, [p for pat in KIT_FILES for p in glob.glob(os.path.join(ROOT, pat))])

    def test_shellcheck(self):
        self.assertTrue(shutil.which("shellcheck"), "shellcheck missing: run make deps")
        for path in [LIB] + [h for _, h, _ in harnesses()]:
            with self.subTest(path=os.path.relpath(path, ROOT)):
                res = subprocess.run(["shellcheck", "-x", "-s", "sh", path],
                                     capture_output=True, text=True)
                self.assertEqual(res.returncode, 0, res.stdout)


class ProtocolTest(unittest.TestCase):
    """Each harness, run on the faked guest."""

    def setUp(self):
        self.assertTrue(DASH, "dash missing")

    def run_harness(self, spec, path, flags=()):
        programs = [n[:-2] for n in os.listdir(os.path.join(spec.dir, "tests"))
                    if n.endswith(".c")]
        g = FakeGuest(spec.module, programs, flags)
        self.addCleanup(g.close)
        nonce = ktap.make_nonce()
        g.write("job/nonce", nonce + "\n")
        with open(path) as f:
            g.run(f.read(), {"SEEDS": "3 5 7", "CMDS": "100", "CYCLES": "10"})
        return g, nonce

    def check_protocol(self, g, nonce):
        # The end line goes out after a newline of its own (a heartbeat killed
        # mid-write leaves half a line): blank lines carry nothing, the host
        # drops them with every untagged line.
        channel = [line for line in g.read("channel").splitlines() if line]
        self.assertTrue(channel, g.result.stderr)
        for line in channel:
            self.assertTrue(line.startswith(nonce + " "), f"untagged: {line!r}")
        self.assertEqual(channel[-1], f"{nonce} {END_LINE}")
        self.assertEqual(sum(line.endswith(END_LINE) for line in channel), 1)
        self.assertFalse(os.path.exists(os.path.join(g.root, "job", "nonce")))
        self.assertFalse(os.path.exists(os.path.join(g.root, "job", "run")))
        self.assertEqual(g.read("leaks"), "")
        seen = g.read("seen")
        self.assertIn("insmod ", seen)
        self.assertNotIn(nonce, seen, "a child process had the nonce in its argv or environment")
        return "\n".join(channel)

    def test_a_passing_driver_passes_every_test(self):
        for spec, path, tests in harnesses():
            with self.subTest(harness=os.path.relpath(path, ROOT)):
                g, nonce = self.run_harness(spec, path)
                channel = self.check_protocol(g, nonce)
                got = ktap.expect(ktap.parse(channel, nonce=nonce), [t.name for t in tests])
                self.assertEqual({n: t.status for n, t in got.items()},
                                 {t.name: ktap.Status.PASS for t in tests}, channel)

    def test_the_fabric_is_read_again_after_each_run(self):
        """Issue 33: after each per-seed run, the driver still loaded, and at
        the end, the fabric's settings with the seed the harness set last, for
        the host to compare with the begin line's (guestout.fabric_changed)."""
        for spec, path, tests in harnesses():
            with self.subTest(harness=os.path.relpath(path, ROOT)):
                g, nonce = self.run_harness(spec, path)
                lines = [line.split(" ", 1)[1] for line in g.read("channel").splitlines()
                         if line.startswith(nonce + " ")]
                fabric = [line for line in lines if guestout.FABRIC_LINE in line]
                per_run = [line for line in fabric if line.startswith("  ")]
                self.assertGreaterEqual(len(per_run), 3, lines)
                for line in per_run:
                    self.assertRegex(line, r"^  # mmiolab fabric: set_seed=(\d+) "
                                           r"harness_changes=\d+ seed=\1$")
                # Last before the end line (and the benchmark's CPU line).
                tail = [line for line in lines[:-1] if not line.startswith("# mmiolab guest cpu")]
                self.assertTrue(tail[-1].startswith(guestout.FABRIC_LINE), lines[-3:])
                # The fake's params file keeps only what seed_fabric wrote last
                # (the kernel's changes only the seed): to the host, the
                # profile the begin line read is gone.
                self.assertEqual(guestout.fabric_changed(lines), "profile sn2 -> (unreadable)")

    def test_a_failing_driver_fails_and_the_run_still_ends(self):
        for flags in (("fail-test",), ("fail-insmod",)):
            for spec, path, tests in harnesses():
                with self.subTest(harness=os.path.relpath(path, ROOT), flags=flags):
                    g, nonce = self.run_harness(spec, path, flags)
                    channel = self.check_protocol(g, nonce)
                    got = ktap.expect(ktap.parse(channel, nonce=nonce), [t.name for t in tests])
                    for t in spec.per_seed_tests if path != spec.hidden_harness else tests:
                        if t.name in got:
                            self.assertEqual(got[t.name].status, ktap.Status.FAIL, channel)
                    if "fail-insmod" in flags:
                        self.assertIn("Invalid parameters", channel, "insmod's error is shown")

    def test_the_first_failing_trace_is_sent_unless_a_batch_says_never(self):
        """The grader's harness sends the first failing race run's trace
        (RECORD_SEND=fail, then never); labtest's batches (TRACE_SEND=never)
        trace the runs the same way and send none."""
        spec = load_lab("doorbell")
        path = os.path.join(spec.dir, "tests", "harness.sh")
        for env, want in (({}, ["fail", "never", "never"]),
                          ({"TRACE_SEND": "never"}, ["never"] * 3)):
            with self.subTest(env=env):
                g = FakeGuest(spec.module, ["ringtest", "ordercost"], ("fail-test",))
                self.addCleanup(g.close)
                g.write("job/nonce", ktap.make_nonce() + "\n")
                with open(path) as f:
                    g.run(f.read(), {"SEEDS": "3 5 7", "CMDS": "100", **env})
                # Each "record" line of the fakes' log is followed by its
                # environment: the RECORD_SEND it ran with.
                seen = g.read("seen").split("\nrecord ")[1:]
                sends = [re.search(r"^RECORD_SEND=(\w+)$", r, re.M).group(1) for r in seen]
                self.assertEqual(sends, want, g.read("seen"))

    def test_labstats_batch_ends_every_variant_even_one_killed(self):
        spec = load_lab("doorbell")
        g = FakeGuest(spec.module, [n[:-2] for n in os.listdir(os.path.join(spec.dir, "tests"))
                                    if n.endswith(".c")], ("hang",))
        self.addCleanup(g.close)
        nonces = [secrets.token_hex(16) for _ in range(3)]
        for i, n in enumerate(nonces[:2]):
            g.write(f"job/v/{i}.nonce", n + "\n")
            g.write(f"job/v/{i}.ko", "")
        g.write("job/v/batch.nonce", nonces[2] + "\n")
        with open(os.path.join(spec.dir, "tests", "harness.sh")) as f:
            g.write("job/harness.sh", moved(f.read(), g.root), 0o755)
        # Variant 0 hangs in its first test program and is killed; variant 1 runs.
        g.write("bin/timeout", '#!/bin/sh\n[ -e "$T/hang" ] || exec /usr/bin/timeout "$@"\n'
                'shift 3; /usr/bin/timeout -s KILL 2 "$@"; rc=$?; rm "$T/hang"; exit $rc\n',
                0o755)
        g.run(labtest.batch_command(spec.module, 2, [3, 5], 100, 60), {})
        channel = [line for line in g.read("channel").splitlines() if line]
        for line in channel:
            self.assertTrue(line.split(" ", 1)[0] in nonces, f"untagged: {line!r}")
        ends = [line.split(" ", 1)[0] for line in channel if line.endswith(END_LINE)]
        self.assertEqual(ends[0], nonces[0], "the killed variant's end line")
        self.assertEqual(ends[-1], nonces[2], "the batch's end line, last")
        v1 = "\n".join(line for line in channel if line.startswith(nonces[1]))
        got = ktap.expect(ktap.parse(v1, nonce=nonces[1]), [t.name for t in spec.ktap_tests])
        self.assertTrue(all(t.status == ktap.Status.PASS for t in got.values()), v1)
        self.assertNotIn(nonces[0], g.read("seen"))

    def test_modern_race_only_races_that_path_alone(self):
        """RACE_ONLY (the suite's, tests/test_labs.py): the path named is
        raced on every seed, the others are reported skipped, not run."""
        spec = load_lab("modern")
        g = FakeGuest(spec.module, ["ringtest"])
        self.addCleanup(g.close)
        nonce = ktap.make_nonce()
        g.write("job/nonce", nonce + "\n")
        with open(os.path.join(spec.dir, "tests", "harness.sh")) as f:
            g.run(f.read(), {"SEEDS": "3 5", "CMDS": "100", "RACE_ONLY": "mutex"})
        channel = self.check_protocol(g, nonce)
        got = ktap.expect(ktap.parse(channel, nonce=nonce), ["unlock", "relaxed", "mutex"])
        self.assertEqual(got["mutex"].status, ktap.Status.PASS, channel)
        self.assertEqual([t.name for t in got["mutex"].subtests], ["seed_3", "seed_5"])
        for name in ("unlock", "relaxed"):
            self.assertEqual(got[name].status, ktap.Status.SKIP, channel)
            self.assertEqual(got[name].subtests, [])
        races = [c for c in g.read("seen").splitlines()
                 if c.startswith("program ") and "-N seed_" in c]
        self.assertEqual(len(races), 2, races)
        self.assertTrue(all("-m 3 " in c for c in races), races)

    def test_batch_environment_is_quoted_and_checked(self):
        cmd = labtest.batch_command("ringdrv", 1, [1], 100, 60, {"RACE_ONLY": "a b;c"})
        self.assertIn("CMDS=100 TRACE_SEND=never RACE_ONLY='a b;c' timeout", cmd)
        for bad in ("SEEDS", "CMDS", "TRACE_SEND", "lower", "A=B", ""):
            with self.subTest(name=bad), self.assertRaises(ValueError):
                labtest.batch_command("ringdrv", 1, [1], 100, 60, {bad: "1"})


if __name__ == "__main__":
    unittest.main()
