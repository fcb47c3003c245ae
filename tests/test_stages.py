"""The grading stages: prepare (a submission made ready to run, or refused with
the grader's words), run (the guests), score (points) and write (the outputs),
and grade.grade_one, which runs them in order.

Most tests fake what needs a compiler or a guest, as kunit_tool_test.py fakes
its kernel tree: the build (stages.build_driver), the disassembler and the
guest (stages.run_tests, FakeGuest: it answers with recorded guest output,
tests/data/ktap). The module they 'build' is a real ELF object, made here, so
the ELF check runs for real; the disassembly is objdump's text, written here;
the guest's output is read by the grader's own parsers. One test builds the
doorbell starter for real; none boots a guest.
"""

import csv
import dataclasses
import json
import os
import shutil
import struct
import tempfile
import time
import unittest
from unittest import mock

from mmiolab import ROOT, grade, gradebook, guestout, kernel, lab, labspec, model, \
    objcheck, report, stages, vm
from mmiolab.platforms import PLATFORMS
from mmiolab.config import Config
from mmiolab.lab import BuildFailed, build_text
from kitcfg import BUILD, CFG, TREE

DOORBELL = os.path.join(ROOT, "labs", "doorbell")
PROBE_END = "\tdev_info(dev, \"ring of %d descriptors, irq %d\\n\", RING_ENTRIES, irq);\n"
CLEAN_CODE = ("Disassembly of section .text:\n\n0000000000000000 <ringdrv_post>:\n"
              "   0:\tnop\n   1:\tret\n")


def starter() -> str:
    with open(os.path.join(DOORBELL, "starter", "ringdrv.c")) as f:
        return f.read()


def module_elf(imports: list[str]) -> bytes:
    """An x86-64 relocatable object with a little code and these undefined symbols."""
    text = b"\x90" * 16
    strtab = b"\0" + b"".join(n.encode() + b"\0" for n in imports)
    symtab = bytes(24)                                  # the null symbol
    off = 1
    for name in imports:
        symtab += struct.pack("<IBBHQQ", off, objcheck.STB_GLOBAL << 4, 0, objcheck.SHN_UNDEF,
                              0, 0)
        off += len(name) + 1
    names = [b"", b".text", b".symtab", b".strtab", b".shstrtab"]
    shstrtab = b"\0".join(names) + b"\0"
    name_off = [shstrtab.index(n + b"\0") if n else 0 for n in names]
    blobs = [b"", text, symtab, strtab, shstrtab]
    data, offsets = bytearray(64), []
    for b in blobs:
        offsets.append(len(data))
        data += b
    shoff = len(data)
    # (type, flags, link, entsize) of each section
    kinds = [(0, 0, 0, 0), (1, objcheck.SHF_ALLOC | objcheck.SHF_EXECINSTR, 0, 0),
             (objcheck.SHT_SYMTAB, 0, 3, 24), (3, 0, 0, 0), (3, 0, 0, 0)]
    for i, (typ, flags, link, entsize) in enumerate(kinds):
        data += struct.pack("<IIQQQQIIQQ", name_off[i], typ, flags, 0, offsets[i],
                            len(blobs[i]), link, 1 if typ == objcheck.SHT_SYMTAB else 0, 1,
                            entsize)
    data[:64] = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01", 1, 62, 1, 0, 0,
                            shoff, 0, 64, 0, 0, 64, len(kinds), 4)
    return bytes(data)


class FakeBuild:
    """Stands in for lab.build_driver: writes build.log and a module, or fails as a
    compiler would; remembers how it was called."""

    def __init__(self, imports=("_printk",), warnings=(), fail="", system_note=""):
        self.imports, self.warnings, self.fail = list(imports), list(warnings), fail
        self.system_note = system_note
        self.calls = []

    def __call__(self, lab_, source, workdir, confined=True, named="", cfg=None):
        self.calls.append({"lab": lab_, "source": source, "workdir": workdir,
                           "confined": confined, "named": named, "cfg": cfg})
        os.makedirs(workdir, exist_ok=True)
        log = "make: Entering directory 'linux-build'\n  CC [M]  ringdrv.o\n"
        log += "".join(w + "\n" for w in self.warnings)
        if self.fail:
            log += self.fail + "\n"
        with open(os.path.join(workdir, "build.log"), "w") as f:
            f.write(log)
        if self.fail:
            raise BuildFailed(self.fail)
        ko = os.path.join(workdir, f"{lab_.module}.ko")
        with open(ko, "wb") as f:
            f.write(module_elf(self.imports))
        return lab.Build(ko, self.warnings, log, confined, self.system_note)


class PrepareTest(unittest.TestCase):
    def setUp(self):
        self.spec = labspec.load_lab("doorbell")
        self.tmp = tempfile.mkdtemp(prefix="stages-", dir=BUILD)
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.work = os.path.join(self.tmp, "work")
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.work)
        os.makedirs(self.out)

    def submit(self, text: str, name: str = "alice.c") -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def prepare(self, path, build=None, code=CLEAN_CODE, **kw):
        """stages.prepare with the build and the disassembler faked (code: objdump's
        text, or a function that stands in for lab.disassemble)."""
        build = build or FakeBuild()
        kw.setdefault("shown", os.path.basename(path))
        kw.setdefault("confined", True)
        kw.setdefault("cfg", CFG)
        objdump = code if callable(code) else lambda *a, **k: code
        with mock.patch.object(stages, "build_driver", build), \
                mock.patch.object(stages, "disassemble", objdump):
            return stages.prepare(self.spec, path, self.work, **kw)

    def assert_no_host_path(self, text):
        for host in (self.tmp, BUILD, ROOT):
            self.assertNotIn(host, text)

    def test_refused_at_intake_in_the_students_name(self):
        build = FakeBuild()
        r = self.prepare(os.path.join(self.tmp, "gone", "alice.c"), build, shown="alice.c",
                         out_dir=self.out)
        self.assertIsInstance(r, stages.Refused)
        self.assertEqual(r.verdict, "not-found")
        self.assertEqual(r.why, "intake: not-found: alice.c: No such file or directory")
        self.assertEqual((r.notes, r.flags, r.diff), ([], [], ""))
        self.assertEqual(build.calls, [], "nothing is built")
        self.assertEqual(os.listdir(self.out), [])

    def test_refused_at_intake_an_archive_member_names_no_host_path(self):
        import tarfile
        path = os.path.join(self.tmp, "alice.tar")
        with tarfile.open(path, "w") as tar:
            info = tarfile.TarInfo(os.path.join(ROOT, "ringdrv.c"))
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        r = self.prepare(path, shown="alice.tar")
        self.assertIsInstance(r, stages.Refused)
        self.assertIn("mmiolab/ringdrv.c", r.why)
        self.assert_no_host_path(r.why)

    def test_build_failure_is_refused_with_the_compilers_words(self):
        error = "ringdrv.c:79:59: error: expected ';' before '}' token"
        build = FakeBuild(fail=error)
        src = starter().replace("static int ringdrv_probe", "static int ringdrv_probe oops")
        r = self.prepare(self.submit(src), build, out_dir=self.out)
        self.assertIsInstance(r, stages.Refused)
        self.assertEqual(r.verdict, "build-failed")
        self.assertEqual(r.why, f"ringdrv.c does not compile:\n{error}")
        self.assertIn("CC [M]  ringdrv.o", r.build_log)
        # The review ran before the build: its diff and flags come with the refusal.
        self.assertIn("+static int ringdrv_probe oops", r.diff)
        self.assertTrue(os.path.exists(os.path.join(self.out, "starter.diff")))
        # The lab VM's form: the whole log, the file named as the student did.
        self.work = tempfile.mkdtemp(dir=self.tmp)
        r = self.prepare(self.submit(src), build, source_named="alice.c",
                         whole_build_log=True)
        self.assertEqual(r.why, "alice.c does not compile:\n" + r.build_log)
        self.assertEqual(build.calls[-1]["named"], "alice.c")

    def test_forbidden_symbol_is_refused_before_the_code_is_read(self):
        disassembled = []
        r = self.prepare(self.submit(starter()), FakeBuild(imports=["_printk", "mmiosim_flush"]),
                         code=lambda *a, **k: disassembled.append(a) or CLEAN_CODE)
        self.assertIsInstance(r, stages.Refused)
        self.assertEqual(r.verdict, "forbidden-symbols")
        self.assertEqual(r.why, "the module was not run: imports kernel symbols this lab "
                                "does not allow: mmiosim_flush")
        self.assertEqual(disassembled, [])

    def test_forbidden_code_is_refused(self):
        code = CLEAN_CODE + "   2:\toutb   %al,(%dx)\n"
        r = self.prepare(self.submit(starter()), code=code)
        self.assertIsInstance(r, stages.Refused)
        self.assertEqual(r.verdict, "forbidden-code")
        self.assertEqual(r.why, "the module was not run: port I/O: outb at .text+0x2")

    def test_a_module_that_cannot_be_disassembled_is_refused(self):
        def objdump_fails(*a, **k):
            raise BuildFailed("the module could not be disassembled (failed)", "objdump")
        r = self.prepare(self.submit(starter()), code=objdump_fails)
        self.assertEqual((r.verdict, r.why), (
            "forbidden-code", "the module was not run: the module could not be disassembled "
                              "(failed)"))

    def test_ready_module_with_flags_and_diff(self):
        src = starter().replace("#include <linux/wait.h>\n",
                                "#include <linux/wait.h>\nstatic int spare __used;\n")
        src = src.replace(PROBE_END, PROBE_END + "\tasm volatile(\"nop\");\n")
        warning = "alice.c:40:12: warning: 'spare' defined but not used [-Wunused-variable]"
        build = FakeBuild(warnings=[warning], system_note="this system's gcc is not the one")
        code = CLEAN_CODE + "   2:\tcall   *%rax\n"
        r = self.prepare(self.submit(src), build, code=code, confined=False, out_dir=self.out)
        self.assertIsInstance(r, stages.Prepared)
        self.assertEqual(r.ko, os.path.join(self.work, "build", "ringdrv.ko"))
        self.assertEqual(r.warnings, [warning])
        self.assertEqual(r.system_note, "this system's gcc is not the one")
        self.assertFalse(r.confined)
        self.assertIs(build.calls[0]["lab"], self.spec)      # its limits: Limits.build
        self.assertFalse(build.calls[0]["confined"])
        self.assertEqual(r.source_flags, ["the source uses inline assembly"])
        self.assertEqual(r.object_flags, ["1 indirect calls or jumps (call *%rax at .text+0x2)"])
        # All the instructor's flags, in the grader's order: confinement first,
        # then the source's, the review's, the object's.
        self.assertEqual(r.flags[0], stages.UNCONFINED_FLAG)
        self.assertEqual(r.flags[1], "the source uses inline assembly")
        self.assertRegex(r.flags[2], r"^changes outside the functions a fix touches .*"
                                     r"ringdrv_probe, file-scope code$")
        self.assertEqual(r.flags[3:], r.object_flags)
        self.assertIn("+static int spare __used;", r.diff)
        with open(os.path.join(self.out, "starter.diff")) as f:
            self.assertEqual(f.read(), r.diff + "\n")

    def test_what_intake_leaves_out_is_a_note(self):
        folder = os.path.join(self.tmp, "alice")
        os.makedirs(folder)
        for name, text in (("ringdrv.c", starter()), ("Makefile", "all:\n")):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        r = self.prepare(folder, shown="alice")
        self.assertIsInstance(r, stages.Prepared)
        self.assertEqual(len(r.notes), 1)
        self.assertRegex(r.notes[0], r"^ignored Makefile: ")
        self.assertEqual((r.flags, r.diff), ([], ""))

    def test_the_build_goes_where_it_is_asked(self):
        build = FakeBuild()
        dest = os.path.join(self.tmp, "module")
        r = self.prepare(self.submit(starter()), build, build_dir=dest)
        self.assertEqual(r.ko, os.path.join(dest, "ringdrv.ko"))
        self.assertEqual(build.calls[0]["workdir"], dest)

    def test_build_text_names_the_source_as_the_student_did(self):
        log = ("  CC [M]  ringdrv.o\nIn file included from ringdrv.c:2:\n"
               "ringdrv.c:3:1: error: x\nmy_ringdrv.c:1: not this one\n")
        self.assertEqual(build_text(log, "", "ringdrv.c", "alice.c", cfg=CFG),
                         "  CC [M]  ringdrv.o\nIn file included from alice.c:2:\n"
                         "alice.c:3:1: error: x\nmy_ringdrv.c:1: not this one\n")
        self.assertEqual(build_text(log, "", "ringdrv.c", "", cfg=CFG), log)


class RealBuildTest(unittest.TestCase):
    def test_doorbell_starter_is_ready(self):
        if not os.path.exists(os.path.join(TREE.obj, "Module.symvers")):
            raise AssertionError(f"{TREE.obj} has no built kernel: run 'make kernel' first")
        confined, why = lab.confinement(CFG)
        spec = labspec.load_lab("doorbell")
        tmp = tempfile.mkdtemp(prefix="stages-", dir=BUILD)
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        r = stages.prepare(spec, os.path.join(DOORBELL, "starter", "ringdrv.c"), tmp,
                           shown="ringdrv.c", confined=confined, out_dir=tmp, cfg=CFG)
        self.assertIsInstance(r, stages.Prepared, getattr(r, "why", ""))
        self.assertEqual(r.confined, confined, why)
        self.assertEqual(r.warnings, [])
        self.assertEqual((r.notes, r.diff), ([], ""))
        self.assertEqual(r.flags, [] if confined else [stages.UNCONFINED_FLAG])
        with open(r.ko, "rb") as f:
            self.assertEqual(f.read(4), b"\x7fELF")
        self.assertIn("ringdrv.ko", r.build_log)
        self.assertNotIn(ROOT, r.build_log)
        self.assertFalse(os.path.exists(os.path.join(tmp, "starter.diff")))


# ---------------------------------------------------------------------------- run, score, write

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "ktap")
NONCE = "5f0c1a9e3b7d42c8a6e1f90b2d4c7e38"      # the recorded samples' (data/ktap/README)
WARNING = "[    2.000000] WARNING: CPU: 0 PID: 9 at ringdrv.c:88 ring_probe+0x1/0x2\n"


def recorded(name: str) -> str:
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def harness(lines: list[str]) -> str:
    return "".join(f"{NONCE} {line}\n" for line in lines)


class FakeGuest:
    """Stands in for lab.run_tests: answers each guest with recorded output
    (the visible run: a channel file of data/ktap, the hidden run: `hidden`),
    writes its console.log where the real one would be, and remembers how it was
    called."""

    HIDDEN_PASS = ["KTAP version 1", "1..2", "ok 1 race_4cpu", "ok 2 race_long"]

    def __init__(self, channel="pass.channel.log", console=None, status="exited",
                 hidden=None, hidden_console="", hidden_status="exited", hidden_boot=0.5):
        self.channel, self.status = channel, status
        self.hidden_boot = hidden_boot      # None: the guest went down before the harness
        self.console = recorded("pass.console.log") if console is None else console
        self.hidden = self.HIDDEN_PASS if hidden is None else hidden
        self.hidden_console, self.hidden_status = hidden_console, hidden_status
        self.calls = []

    def __call__(self, lab_, ko, seeds, log_dir, **kw):
        self.calls.append({"lab": lab_, "ko": ko, "seeds": list(seeds), "log_dir": log_dir, **kw})
        os.makedirs(log_dir, exist_ok=True)
        if kw.get("harness"):
            channel = harness(self.hidden + ["# mmiolab harness: end"])
            console, status, boot = self.hidden_console, self.hidden_status, self.hidden_boot
        else:
            channel = recorded(self.channel) + harness(["# mmiolab harness: end"])
            console, status, boot = self.console, self.status, 0.5
        log = os.path.join(log_dir, "console.log")
        with open(log, "w") as f:
            f.write(console)
        res = vm.RunResult(status, 0 if status == "exited" else None, console, channel, 2.0,
                           boot, "tcg", log)
        return lab.Run(list(seeds), NONCE, res, list(kw.get("append") or []))


class StageCase(unittest.TestCase):
    def setUp(self):
        self.spec = labspec.load_lab("doorbell")
        self.tmp = tempfile.mkdtemp(prefix="stages-", dir=BUILD)
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.out)

    def prepared(self, **kw) -> stages.Prepared:
        ko = os.path.join(self.tmp, "ringdrv.ko")
        open(ko, "wb").close()
        return stages.Prepared(ko=ko, warnings=kw.pop("warnings", []), **kw)

    def run_stage(self, guest: FakeGuest, ready=None, seeds=(1, 2, 3), slowdown=1.0,
                  **kw) -> stages.Ran:
        with mock.patch.object(stages, "run_tests", guest), \
                mock.patch.object(stages.speed, "slowdown", return_value=slowdown):
            return stages.run(self.spec, ready or self.prepared(), list(seeds), self.out,
                              **{"cfg": CFG, **kw})

    def ran(self, **guest) -> stages.Ran:
        """The run stage's result with its guests faked, read in this process
        (guestout.read: what the bounded child runs)."""
        with mock.patch.object(stages.guestout, "read_bounded", guestout.read):
            return self.run_stage(FakeGuest(**guest))

    def by_name(self, result: model.GradeResult) -> dict[str, model.TestOutcome]:
        return {t.name: t for t in result.tests}


class RunStageTest(StageCase):
    def test_visible_then_hidden_each_in_its_guest(self):
        guest = FakeGuest()
        ran = self.run_stage(guest, cmds=77, append=("mmiosim.jitter_ns=5",), title="t",
                             slowdown=3.0)
        visible, hidden = guest.calls
        fabric = stages.fabric_append(self.spec)
        # The guest's lockup detectors scaled as the run's limits are (3x).
        detectors = ["rcupdate.rcu_cpu_stall_timeout=63", "watchdog_thresh=30"]
        self.assertEqual(visible["append"], fabric + ["mmiosim.jitter_ns=5"] + detectors)
        self.assertEqual((visible["log_dir"], visible["cmds"], visible["seeds"]),
                         (self.out, 77, [1, 2, 3]))
        # The lab's limits, scaled to the machine (speed.slowdown, faked: 3).
        lim = self.spec.limits
        self.assertEqual((visible["timeout"], visible["stall_timeout"], visible["console_cap"]),
                         (lim.run_timeout * 3, lim.stall_timeout * 3, lim.console_cap))
        self.assertEqual(hidden["timeout"], lim.run_timeout * 3)
        self.assertNotIn("harness", visible)
        self.assertEqual(hidden["append"], stages.fabric_append(self.spec, hidden=True)
                         + ["mmiosim.jitter_ns=5"] + detectors)
        self.assertEqual((hidden["harness"], hidden["smp"], hidden["log_dir"]),
                         (self.spec.hidden_harness, self.spec.hidden_smp,
                          os.path.join(self.out, "hidden")))
        self.assertEqual(ran.visible.nonce, NONCE)
        self.assertEqual([t.name for t in ran.seen.parsed.root.subtests][:2],
                         ["load_unload", "single_cpu"])
        self.assertEqual([t.name for t in ran.hidden_seen.parsed.root.subtests],
                         ["race_4cpu", "race_long"])
        self.assertIn("profile=sn2", ran.seen.info)

    def test_the_guests_lockup_detectors_wait_as_long_as_the_host_does(self):
        self.assertEqual(stages.detector_append(1.0), [])
        self.assertEqual(stages.detector_append(8.0), ["rcupdate.rcu_cpu_stall_timeout=168",
                                                       "watchdog_thresh=60"])
        self.assertEqual(stages.detector_append(40.0)[0], "rcupdate.rcu_cpu_stall_timeout=300")
        # Each still fires before the host's own stall limit, to name a lockup.
        for factor in (1.5, 3.0, 8.0, 40.0):
            words = dict(w.split("=") for w in stages.detector_append(factor))
            stall = self.spec.limits.stall_timeout * factor
            self.assertLess(int(words["rcupdate.rcu_cpu_stall_timeout"]), stall)
            self.assertLess(2 * int(words["watchdog_thresh"]), stall)

    def test_no_hidden_guest_after_a_visible_one_that_did_not_finish(self):
        guest = FakeGuest(status="hang")
        ran = self.run_stage(guest)
        self.assertEqual(len(guest.calls), 1)
        self.assertIsNone(ran.hidden)
        self.assertIsNone(ran.hidden_seen)

    def test_a_lab_without_hidden_tests_boots_one_guest(self):
        self.spec = labspec.LabSpec(**{**vars(self.spec), "tests": tuple(
            t for t in self.spec.tests if t.source != "hidden")})
        guest = FakeGuest()
        self.run_stage(guest)
        self.assertEqual(len(guest.calls), 1)

    def test_a_deadline_cuts_each_guests_limits_short(self):
        # A platform's time limit (grade --platform): no guest outlives it.
        guest = FakeGuest()
        with mock.patch.object(stages.guestout, "read_bounded", guestout.read):
            self.run_stage(guest, deadline=time.monotonic() + 100)
        visible, hidden = guest.calls
        for call in (visible, hidden):
            self.assertLessEqual(call["timeout"], 100)
            self.assertLessEqual(call["stall_timeout"], call["timeout"])

    def test_no_hidden_guest_without_the_time_for_it_and_it_is_not_charged(self):
        guest = FakeGuest()
        with mock.patch.object(stages.guestout, "read_bounded", guestout.read):
            ran = self.run_stage(guest, deadline=time.monotonic() + stages.MIN_HIDDEN_RUN / 2)
        self.assertEqual(len(guest.calls), 1)
        self.assertIn("time limit", ran.out_of_time)
        r = stages.score(self.spec, "alice", self.prepared(), ran)
        t = self.by_name(r)
        self.assertEqual(r.verdict, model.TOO_SLOW)
        self.assertEqual(t["race"].status, "passed")
        for name in ("race_4cpu", "race_long"):
            self.assertEqual((t[name].status, t[name].score), ("error", 0), name)
            self.assertIn(stages.TOO_SLOW_WORDS, t[name].output)

    def test_run_guest_takes_other_limits_when_given(self):
        guest = FakeGuest()
        with mock.patch.object(stages, "run_tests", guest):
            stages.run_guest(self.spec, "x.ko", [5], self.out, hidden=True, timeout=9,
                             console_cap=1000, cfg=CFG)
        call, = guest.calls
        self.assertEqual((call["timeout"], call["console_cap"], call["harness"]),
                         (9, 1000, self.spec.hidden_harness))


class ScoreStageTest(StageCase):
    def test_a_passing_run_earns_every_point(self):
        r = stages.score(self.spec, "alice", self.prepared(), self.ran())
        self.assertEqual((r.score, r.max_score, r.verdict), (100, 100, "graded"))
        self.assertEqual(r.replay.seeds_passed, 3)
        self.assertEqual((r.replay.profile, r.replay.semantics), ("sn2", "2004"))
        self.assertEqual(r.console_log, "console.log")
        self.assertEqual((r.notes, r.flags, r.console_excerpt), ([], [], ""))

    def test_the_race_fails_on_every_seed(self):
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(channel="race-fail.channel.log"))
        t = self.by_name(r)
        self.assertEqual((t["race"].status, t["race"].score), ("failed", 0))
        self.assertIn("why: seed_1: 6 commands lost", t["race"].output)
        self.assertEqual((r.replay.seeds_passed, r.replay.first_failing_seed), (0, 1))

    def test_build_warnings_cost_the_build_test_and_a_system_note_does_not(self):
        ready = self.prepared(warnings=["ringdrv.c:9:1: warning: unused"], system_note="gcc")
        t = self.by_name(stages.score(self.spec, "alice", ready, self.ran()))
        self.assertEqual((t["build"].status, t["build"].score), ("failed", 0))
        self.assertEqual(t["build"].output, "the build printed warnings:\n"
                                            "ringdrv.c:9:1: warning: unused\n(not counted: gcc)")
        ready = self.prepared(system_note="gcc")
        t = self.by_name(stages.score(self.spec, "alice", ready, self.ran()))
        self.assertEqual((t["build"].score, t["build"].output),
                         (10, "built with no warnings\n(not counted: gcc)"))

    def test_a_crash_fails_the_rest_and_clean_log_and_runs_no_hidden_test(self):
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(channel="crash.channel.log",
                                  console=recorded("crash.console.log"), status="panic"))
        t = self.by_name(r)
        self.assertEqual((t["race"].status, t["cost"].status), ("crashed", "crashed"))
        self.assertEqual(t["clean_log"].status, "failed")
        self.assertIn("Kernel panic", r.console_excerpt)
        self.assertEqual(r.notes, ["the guest kernel panicked (oops or panic; see the console "
                                   "log) [tcg, 2.0s]"])
        for name in ("race_4cpu", "race_long"):
            self.assertEqual((t[name].status, t[name].output.splitlines()[-1]),
                             ("error", "the hidden tests did not run"))

    def test_a_run_stuck_without_progress_is_charged_as_a_hang(self):
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(channel="crash.channel.log", status="hang"))
        t = self.by_name(r)
        self.assertEqual(r.verdict, "graded")
        self.assertEqual((t["race"].status, t["clean_log"].status), ("crashed", "failed"))

    def test_a_run_still_progressing_at_its_ceiling_is_not_charged(self):
        # The same output as a hang, but the run was still making progress:
        # the grading machine was too slow, which says nothing of the driver.
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(channel="crash.channel.log", status="slow"))
        t = self.by_name(r)
        self.assertEqual(r.verdict, model.TOO_SLOW)
        self.assertEqual(r.notes[0], stages.TOO_SLOW_WORDS)
        self.assertEqual(t["build"].status, "passed")
        for name in ("race", "cost", "clean_log", "race_4cpu", "race_long"):
            self.assertEqual((t[name].status, t[name].score), ("error", 0), name)
            self.assertIn(stages.TOO_SLOW_WORDS, t[name].output)
        words = report.summary_text(r) + "".join(x.output for x in r.tests)
        for word in ("crash", "hang", "did not finish in time"):
            self.assertNotIn(word, words.replace("crash, hang", ""))

    def test_a_slow_hidden_run_keeps_what_it_reported(self):
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(hidden=["KTAP version 1", "1..2", "ok 1 race_4cpu"],
                                  hidden_status="slow"))
        t = self.by_name(r)
        self.assertEqual(r.verdict, model.TOO_SLOW)
        self.assertEqual((t["race_4cpu"].status, t["race_long"].status), ("passed", "error"))
        self.assertEqual((t["race"].status, t["clean_log"].status), ("passed", "passed"))

    STARVED = ("  # seed_1: seed=1 cpus=4 commands=96 completed=94 lost=2 corrupt=0 "
               "errors=0 duplicated=0 stale_commands=0 stale_doorbells=0 overtakes=3")

    def hidden_race_4cpu(self, *cases):
        """A hidden run whose race_4cpu has these (diagnostics, result) cases."""
        lines = ["KTAP version 1", "1..2", "  KTAP version 1", "  # Subtest: race_4cpu",
                 f"  1..{len(cases)}"]
        for diags, result in cases:
            lines += diags + [result]
        return lines + ["not ok 1 race_4cpu", "ok 2 race_long"]

    def test_commands_late_on_a_starved_guest_are_not_charged(self):
        # Seen at half a CPU: the modern reference lost 2 of its commands to
        # its own 2 s timeout on four starved vCPUs; the card ran them later.
        late = [self.STARVED, "  # seed_1: starved=2 (every command ... not the ring raced)"]
        r = stages.score(self.spec, "alice", self.prepared(), self.ran(
            hidden=self.hidden_race_4cpu((late, "  not ok 1 seed_1"))))
        t = self.by_name(r)
        self.assertEqual(r.verdict, model.TOO_SLOW)
        self.assertEqual(r.notes[0], stages.STARVED_WORDS)
        self.assertEqual((t["race_4cpu"].status, t["race_4cpu"].score), ("error", 0))
        self.assertIn("seed_1: starved=2", t["race_4cpu"].output)
        self.assertEqual((t["race"].status, t["race_long"].status), ("passed", "passed"))

    def test_a_single_run_late_on_a_starved_guest_is_not_charged(self):
        r = stages.score(self.spec, "alice", self.prepared(), self.ran(hidden=[
            "KTAP version 1", "1..2", "ok 1 race_4cpu",
            "# race_long: seed=1 cpus=4 commands=3136 completed=3135 lost=1 stale_doorbells=0",
            "# race_long: starved=1 (...)", "not ok 2 race_long"]))
        t = self.by_name(r)
        self.assertEqual(r.verdict, model.TOO_SLOW)
        self.assertEqual((t["race_long"].status, t["race_4cpu"].status), ("error", "passed"))

    def test_lateness_beside_a_warning_is_graded(self):
        # A driver that spins 2.5 s under its lock makes its commands late and
        # the kernel warn: the warning is the driver's (seen with mdelay()).
        r = stages.score(self.spec, "alice", self.prepared(), self.ran(hidden=[
            "KTAP version 1", "1..2", "ok 1 race_4cpu",
            "# race_long: starved=1 (...)", "not ok 2 race_long"], hidden_console=WARNING))
        self.assertEqual(r.verdict, "graded")
        self.assertEqual(self.by_name(r)["race_long"].status, "failed")

    def fast_clock(self, ran, beats):
        res = ran.visible.result
        ran.visible.result = dataclasses.replace(res, seconds=30.5, boot_seconds=0.5,
                                                 beats=beats)
        return ran

    def test_a_failure_on_a_guest_with_a_fast_clock_is_not_charged(self):
        # Seen under host load: a correct posting driver lost 6 commands to
        # timeouts in a guest whose clock ran about five times fast.
        ran = self.fast_clock(self.ran(channel="race-fail.channel.log"), beats=150)
        r = stages.score(self.spec, "alice", self.prepared(), ran)
        t = self.by_name(r)
        self.assertEqual(r.verdict, "grader-error")
        self.assertEqual(r.notes[0], stages.FAST_CLOCK_WORDS)
        self.assertEqual((t["race"].status, t["race"].score), ("error", 0))
        self.assertIn("5.0 times as fast", t["race"].output)
        self.assertEqual(t["build"].status, "passed")

    def test_a_clock_that_keeps_time_or_a_pass_is_graded(self):
        ran = self.fast_clock(self.ran(channel="race-fail.channel.log"), beats=29)
        self.assertEqual(stages.score(self.spec, "a", self.prepared(), ran).verdict, "graded")
        ran = self.fast_clock(self.ran(), beats=150)
        r = stages.score(self.spec, "a", self.prepared(), ran)
        self.assertEqual((r.verdict, r.score), ("graded", 100))

    def test_a_race_beside_a_starved_seed_is_graded(self):
        late = [self.STARVED, "  # seed_1: starved=2 (...)"]
        raced = [self.STARVED.replace("seed_1", "seed_2").replace("stale_doorbells=0",
                                                                   "stale_doorbells=1")]
        r = stages.score(self.spec, "alice", self.prepared(), self.ran(
            hidden=self.hidden_race_4cpu((late, "  not ok 1 seed_1"),
                                         (raced, "  not ok 2 seed_2"))))
        t = self.by_name(r)
        self.assertEqual(r.verdict, "graded")
        self.assertEqual((t["race_4cpu"].status, t["race_4cpu"].score), ("failed", 0))

    def test_a_guest_down_before_its_harness_started_is_not_charged(self):
        # Seen at half a CPU: the hidden guest oopsed at boot (int3, 1.3 s in)
        # twice, before the harness had loaded the driver.
        boot_oops = recorded("crash.console.log")
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(hidden=[], hidden_console=boot_oops, hidden_status="panic",
                                  hidden_boot=None))
        t = self.by_name(r)
        self.assertEqual(r.verdict, "grader-error")
        self.assertEqual(r.notes[0], stages.NO_BOOT_WORDS)
        for name in ("race_4cpu", "race_long"):
            self.assertEqual((t[name].status, t[name].score), ("error", 0), name)
            self.assertIn(stages.NO_BOOT_WORDS, t[name].output)
        self.assertEqual((t["race"].status, t["clean_log"].status), ("passed", "passed"))

    def test_a_warning_in_the_hidden_guest_stays_in_the_hidden_tests(self):
        r = stages.score(self.spec, "alice", self.prepared(), self.ran(hidden_console=WARNING))
        t = self.by_name(r)
        self.assertEqual(t["clean_log"].status, "passed")
        for name in ("race_4cpu", "race_long"):
            self.assertEqual((t[name].status, t[name].score), ("failed", 0))
            self.assertIn("warning in the console log of the hidden tests' run", t[name].output)
        self.assertEqual((r.notes, r.console_excerpt), ([], ""))
        self.assertNotIn("ring_probe", report.summary_text(r))

    def test_a_race_passed_with_no_visible_flush_is_flagged(self):
        with mock.patch.object(stages.guestout, "read_bounded", guestout.read):
            ran = self.run_stage(FakeGuest())
        ran.seen = guestout.read(ran.visible.result.channel.replace("flush=mmiowb", "flush=none"),
                                 ran.visible.result.console, NONCE)
        ready = self.prepared(flags=["the source uses inline assembly"])
        r = stages.score(self.spec, "alice", ready, ran)
        none = self.spec.test("cost").credit_for({"flush": "none"})
        self.assertEqual(r.flags, ["the source uses inline assembly", none.flag])
        self.assertEqual(self.by_name(r)["cost"].score, 0)
        self.assertEqual(ready.flags, ["the source uses inline assembly"], "prepare's, untouched")

    def test_a_race_in_any_run_takes_the_race_marks(self):
        """Issue 33: race_every_run (all_of race and the hidden races) is lost
        to a race in the hidden run as to one in the visible run; what the
        student sees at once says the race is re-checked, not how it went."""
        every = self.spec.test("race_every_run")
        r = stages.score(self.spec, "alice", self.prepared(), self.ran(
            hidden=["KTAP version 1", "1..2", "# race_4cpu: lost=3", "not ok 1 race_4cpu",
                    "ok 2 race_long"]))
        t = self.by_name(r)
        self.assertEqual((t["race"].score, t["race_4cpu"].score), (10, 0))
        self.assertEqual((t["race_every_run"].status, t["race_every_run"].score), ("failed", 0))
        self.assertIn("why: race_4cpu: failed", t["race_every_run"].output)
        self.assertEqual(r.score, 100 - every.points - self.spec.test("race_4cpu").points)
        summary = report.summary_text(r)
        self.assertIn(f"note: {every.notice}", summary)
        for hidden in ("race_4cpu", "race_long", "race_every_run"):
            self.assertNotIn(hidden, summary)
        # The same points go to a race in the visible run.
        t = self.by_name(stages.score(self.spec, "alice", self.prepared(),
                                      self.ran(channel="race-fail.channel.log")))
        self.assertEqual((t["race_every_run"].status, t["race_every_run"].score), ("failed", 0))
        self.assertIn("why: race: failed", t["race_every_run"].output)
        # Every run passed: the points.
        t = self.by_name(stages.score(self.spec, "alice", self.prepared(), self.ran()))
        self.assertEqual((t["race_every_run"].status, t["race_every_run"].score),
                         ("passed", every.points))

    def test_a_race_every_run_cut_short_by_the_grader_is_not_charged(self):
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(hidden=["KTAP version 1", "1..2", "ok 1 race_4cpu"],
                                  hidden_status="slow"))
        t = self.by_name(r)
        self.assertEqual((t["race_long"].status, t["race_every_run"].status), ("error", "error"))
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(channel="crash.channel.log",
                                  console=recorded("crash.console.log"), status="panic"))
        self.assertEqual(self.by_name(r)["race_every_run"].status, "failed")   # race crashed

    def test_output_that_could_not_be_read_is_a_failure_that_says_why(self):
        ran = self.ran()
        ran.seen = guestout.unread("the guest's output was not read: too slow")
        r = stages.score(self.spec, "alice", self.prepared(), ran)
        t = self.by_name(r)
        self.assertEqual(t["clean_log"].status, "failed")
        self.assertEqual(r.notes, ["the guest's output was not read: too slow"])
        self.assertEqual(t["race"].status, "crashed")

    def test_a_refused_submission_scores_nothing_and_says_what_a_run_would_be(self):
        why = stages.Refused(verdict="forbidden-symbols", why="imports x", notes=["ignored a"],
                             flags=["f"], diff="+x")
        r = stages.refused(self.spec, "alice", why, [4, 5])
        self.assertEqual((r.score, r.verdict, r.notes, r.flags, r.diff),
                         (0, "forbidden-symbols", ["imports x", "ignored a"], ["f"], "+x"))
        self.assertTrue(all(t.status == "error" and t.output.endswith("not run: imports x")
                            for t in r.tests))
        self.assertEqual((r.replay.seeds, r.replay.profile), ([4, 5], "sn2"))

    def test_a_replay_keeps_the_fabrics_clock(self):
        info = ("lab=doorbell module=ringdrv cpus=2 seeds=1 profile=sn2 route_ns=800,4000 "
                "stall_ppm=0 seed=1 locking=2004 clock=skip changes=0")
        rep = stages.replay(self.spec, [1], None, info)
        self.assertEqual((rep.profile, rep.semantics, rep.params),
                         ("sn2", "2004", {"route_ns": "800,4000", "stall_ppm": "0",
                                          "clock": "skip"}))
        self.assertIn("clock=skip", rep.describe())


class WriteStageTest(StageCase):
    def result(self) -> model.GradeResult:
        r = stages.score(self.spec, "alice", self.prepared(), self.ran())
        r.submission = "alice.c"
        return r

    def test_the_outputs_the_gradebook_row_and_a_platforms_file(self):
        r = self.result()
        book = os.path.join(self.tmp, "gradebook.csv")
        gs = os.path.join(self.tmp, "autograder", "results", "results.json")
        done = stages.write(r, self.out, gradebook=book, source="/class/alice.c",
                            platform=PLATFORMS["gradescope"], platform_results=gs)
        self.assertEqual(sorted(done.files), ["instructor", "instructor_text", "junit",
                                              "results", "summary"])
        for path in done.files.values():
            self.assertEqual(os.path.dirname(path), self.out)
        with open(done.files["results"]) as f, open(gs) as g:
            self.assertEqual(f.read(), g.read(), "Gradescope's file is the results.json")
        self.assertEqual(done.platform, gs)
        self.assertEqual((done.gradebook.added, done.gradebook.rows), (1, 1))
        with open(book) as f:
            row, = csv.DictReader(f)
        self.assertEqual((row["student"], row["score"], row["submission"], row["results"]),
                         ("alice", "100", "/class/alice.c", done.files["results"]))

    def test_a_result_too_slow_to_grade_gives_gradescope_no_score(self):
        # No results.json: Gradescope says the autograder failed, to the
        # student, and shows the instructor the grader's output; ours stay.
        r = stages.score(self.spec, "alice", self.prepared(),
                         self.ran(channel="crash.channel.log", status="slow"))
        gs = os.path.join(self.tmp, "autograder", "results", "results.json")
        with mock.patch("sys.stdout"):
            done = stages.write(r, self.out, platform=PLATFORMS["gradescope"],
                                platform_results=gs)
        self.assertFalse(os.path.exists(gs))
        self.assertEqual(done.platform, "")
        self.assertTrue(os.path.exists(done.files["results"]))

    def test_prairielearns_file(self):
        pl = os.path.join(self.tmp, "grade", "results", "results.json")
        done = stages.write(self.result(), self.out, platform=PLATFORMS["prairielearn"],
                            platform_results=pl)
        with open(pl) as f:
            doc = json.load(f)
        self.assertEqual((doc["score"], doc["gradable"], done.gradebook), (1.0, True, None))

    def test_nothing_but_the_outputs_unless_asked(self):
        done = stages.write(self.result(), self.out)
        self.assertEqual((done.gradebook, done.platform), (None, ""))
        self.assertEqual(sorted(os.listdir(self.out)),
                         ["console.log", "hidden", "instructor.json", "instructor.txt",
                          "junit.xml", "results.json", "summary.txt"])


class PipelineTest(StageCase):
    """grade.grade_one through every stage, the build, the disassembler and the
    guests faked: what each stage hands the next."""

    def grade(self, text, guest=None, build=None, sid="alice", cfg=None, **kw):
        src = os.path.join(self.tmp, f"{sid}.c")
        with open(src, "w") as f:
            f.write(text)
        self.guest, self.build = guest or FakeGuest(), build or FakeBuild()
        opts = grade.GradeOptions(seeds=[1, 2, 3], out=self.out,
                                  cfg=cfg or CFG)
        with mock.patch.object(stages, "build_driver", self.build), \
                mock.patch.object(stages, "disassemble", lambda *a, **k: CLEAN_CODE), \
                mock.patch.object(stages, "run_tests", self.guest):
            return grade.grade_one(self.spec, src, sid, opts, **kw)

    def test_a_passing_submission_goes_through_every_stage(self):
        book = os.path.join(self.out, "gradebook.csv")
        r = self.grade(starter(), gradebook=book)
        self.assertEqual((r.score, r.verdict, r.submission), (100, "graded", "alice.c"))
        self.assertEqual(len(self.build.calls), 1)
        ko = os.path.join(self.build.calls[0]["workdir"], "ringdrv.ko")
        self.assertEqual([c["ko"] for c in self.guest.calls], [ko, ko], "the prepared module runs")
        self.assertEqual(r.key["lab"], "doorbell")
        self.assertEqual(report.load_results_json(
            os.path.join(self.out, "alice", "results.json")).score, 100)
        _, rows = gradebook.read_gradebook(book)
        self.assertEqual([row["student"] for row in rows], ["alice"])
        self.assertFalse(os.path.exists(os.path.dirname(ko)), "the scratch is gone")

    def test_the_commands_configuration_reaches_every_stage(self):
        """One Config, built by the command, is what the build and both guests get."""
        cfg = Config.from_env(os.environ, smp=3, build=BUILD)
        self.grade(starter(), cfg=cfg)
        self.assertEqual([c["cfg"] for c in self.build.calls], [cfg])
        self.assertEqual([c["cfg"] for c in self.guest.calls], [cfg, cfg])

    def test_a_refused_submission_never_reaches_a_guest(self):
        r = self.grade(starter(), build=FakeBuild(imports=["_printk", "mmiosim_flush"]))
        self.assertEqual((r.verdict, r.score), ("forbidden-symbols", 0))
        self.assertEqual(self.guest.calls, [])
        self.assertEqual(r.replay.seeds, [1, 2, 3])
        self.assertTrue(os.path.exists(os.path.join(self.out, "alice", "summary.txt")))

    def test_a_failure_inside_a_stage_is_a_grader_error_with_outputs(self):
        def broken(*a, **k):
            raise RuntimeError("the guest launcher broke")
        with mock.patch("sys.stderr"):
            r = self.grade(starter(), guest=broken)
        self.assertEqual((r.verdict, r.score), ("grader-error", 0))
        self.assertIn("RuntimeError('the guest launcher broke')", r.notes[0])
        with open(os.path.join(self.out, "alice", "grader-error.txt")) as f:
            self.assertIn("the guest launcher broke", f.read())
        self.assertTrue(os.path.exists(os.path.join(self.out, "alice", "results.json")))

    def test_the_gradescope_file_is_written_by_the_pipeline(self):
        root = os.path.join(self.tmp, "autograder")
        gs = os.path.join(root, "results", "results.json")
        self.grade(starter(), sid="submission", platform=PLATFORMS["gradescope"],
                   cfg=Config(build=BUILD, autograder=root))
        with open(gs) as f:
            doc = json.load(f)
        self.assertEqual(doc["score"], 100)
        self.assertEqual(doc["extra_data"]["mmiolab"]["submission"], "submission.c")


class PlainWordsTest(unittest.TestCase):
    def test_the_posting_complete_test_says_why(self):
        """The posting starter can fail the complete test on the card's interrupt
        alone (int_on_after_stop): the why line names it."""
        from mmiolab import ktap
        t = ktap.parse("KTAP version 1\n1..2\nok 1 load_unload\n"
                       "# complete: seed=1 cycles=1 int_on_after_stop=1 irqs_after_stop=0 "
                       "late_irqs=0 lost=0 bad=0 errors=0\nnot ok 2 complete\n"
                       ).expect(["complete"])["complete"]
        self.assertEqual(stages.plain_words(t, labspec.load_lab("posting").phrases),
                         ["complete: 1 sessions whose STOP returned before the interrupt "
                          "disable had reached the card"])


if __name__ == "__main__":
    unittest.main()
