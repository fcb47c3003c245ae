"""stages.prepare, the first grading stage: a submission made ready to run, or
refused with the grader's words.

Most tests fake the build (stages.build_driver) and the disassembler, as
kunit_tool_test.py fakes its kernel tree: no compiler, no sandbox, no guest.
The module they 'build' is a real ELF object, made here, so the ELF check
runs for real; the disassembly is objdump's text, written here. One test
builds the doorbell starter for real.
"""

import os
import shutil
import struct
import tempfile
import unittest
from unittest import mock

from mmiolab import BUILD, ROOT, kernel, lab, labspec, objcheck, stages
from mmiolab.lab import BuildFailed, build_text

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

    def __call__(self, lab_, source, workdir, timeout=120, confined=True, named=""):
        self.calls.append({"source": source, "workdir": workdir, "timeout": timeout,
                           "confined": confined, "named": named})
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
                                "#include <linux/wait.h>\nstatic int spare;\n")
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
        self.assertEqual(build.calls[0]["timeout"], self.spec.limits.build_timeout)
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
        self.assertIn("+static int spare;", r.diff)
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
        self.assertEqual(build_text(log, "", "ringdrv.c", "alice.c"),
                         "  CC [M]  ringdrv.o\nIn file included from alice.c:2:\n"
                         "alice.c:3:1: error: x\nmy_ringdrv.c:1: not this one\n")
        self.assertEqual(build_text(log, "", "ringdrv.c", ""), log)


class RealBuildTest(unittest.TestCase):
    def test_doorbell_starter_is_ready(self):
        if not os.path.exists(os.path.join(kernel.OBJ, "Module.symvers")):
            raise AssertionError(f"{kernel.OBJ} has no built kernel: run 'make kernel' first")
        confined, why = lab.confinement()
        spec = labspec.load_lab("doorbell")
        tmp = tempfile.mkdtemp(prefix="stages-", dir=BUILD)
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        r = stages.prepare(spec, os.path.join(DOORBELL, "starter", "ringdrv.c"), tmp,
                           shown="ringdrv.c", confined=confined, out_dir=tmp)
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


if __name__ == "__main__":
    unittest.main()
