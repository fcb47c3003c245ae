"""scripts/handout: each lab's student kit holds what a student needs and none
of the answers, and it really grades a driver when unpacked elsewhere."""

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

from mmiolab import ROOT, kernel
from mmiolab.handout import pack
from mmiolab.labspec import lab_names, load_lab
from kitcfg import BUILD, CFG, TREE
from vmtest import need_guest, report

PY = "/usr/bin/python3"


def _added_lines(spec, solution: str) -> set[str]:
    """Code lines a reference solution has and its starter lacks: the answer."""
    main = spec.files[0]
    with open(os.path.join(spec.dir, "starter", main)) as f:
        starter = {line.strip() for line in f}
    with open(spec.solution_source(solution, CFG)) as f:
        return {line.strip() for line in f
                if len(line.strip()) > 8 and line.strip() not in starter}


class HandoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(dir=BUILD)
        cls.out = os.path.join(cls.tmp.name, "handout")
        res = subprocess.run([PY, os.path.join(ROOT, "scripts", "handout"), "--out", cls.out],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        cls.res = res
        cls.tars = {}
        if res.returncode == 0:
            for name in lab_names():
                with tarfile.open(os.path.join(cls.out, f"mmiolab-{name}.tar.gz")) as tar:
                    cls.tars[name] = {m.name: tar.extractfile(m).read() for m in tar.getmembers()
                                      if m.isfile()}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.assertEqual(self.res.returncode, 0, self.res.stdout + self.res.stderr)

    def test_every_lab_has_a_handout_with_what_a_student_needs(self):
        for name in lab_names():
            spec = load_lab(name)
            top = f"mmiolab-{name}/"
            files = self.tars[name]
            for need in ("HANDOUT.md", "Makefile", "README.md", "scripts/grade", "vm/kernel.config",
                         "vm/harness-lib.sh",
                         "patches/series", "labs/lab.mk", f"labs/{name}/Makefile",
                         f"labs/{name}/README.rst", f"labs/{name}/lab.toml",
                         f"labs/{name}/starter/{spec.files[0]}", f"labs/{name}/tests/harness.sh",
                         "docs/index.html", f"docs/labs/{name}.html"):
                self.assertIn(top + need, files, f"{name}: {need} missing")
            self.assertTrue(all(n.startswith(top) for n in files), name)
            for tool in ("scripts/labstats", "scripts/handout", "scripts/mmiolab/labtest.py",
                         "scripts/mmiolab/commands/labstats.py"):
                self.assertNotIn(top + tool, files, f"{name}: {tool} runs the solutions")

    def test_no_answers_in_any_handout(self):
        for name in lab_names():
            spec = load_lab(name)
            files = self.tars[name]
            for member in files:
                parts = member.split("/")
                self.assertFalse({"solutions", "fixtures", "tests", "Documentation"} & set(parts[1:2]),
                                 member)
                self.assertNotIn("solutions", parts[3:], member)
                self.assertNotIn("fixtures", parts[3:], member)
            answers = set()
            for sol in spec.solutions:
                answers |= _added_lines(spec, sol)
            self.assertTrue(answers, name)
            for member, data in files.items():
                if f"/labs/{name}/" in member:
                    text = data.decode(errors="replace")
                    leaked = [a for a in answers if a in text]
                    self.assertEqual(leaked, [], f"{member} gives the answer away")
            page = files[f"mmiolab-{name}/docs/labs/{name}.html"].decode()
            self.assertIn("instructor edition", page)
            self.assertNotIn(".patch", page, f"{name}: a wrong-fix fixture in the student page")
            self.assertNotIn("solutions/", page)

    def test_student_pages_point_to_no_tool_left_out(self):
        """The handout's pages and lab handout never send a student to a tool
        the handout leaves out (the instructor's guide may name them)."""
        left_out = ("trace-timeline", "scripts/labstats", "make demo", "scripts/demo")
        for name in lab_names():
            for member, data in self.tars[name].items():
                rel = member.split("/", 1)[1]
                if not (rel.startswith("docs/") and rel.endswith(".html")
                        or rel == f"labs/{name}/README.rst"):
                    continue
                if rel.startswith(("docs/instructor/", "docs/_sources/", "docs/search")):
                    continue
                text = data.decode(errors="replace")
                named = [t for t in left_out if t in text]
                self.assertEqual(named, [], f"{member} points to a tool the handout leaves out")

    def test_lab_toml_keeps_its_data_not_its_notes(self):
        """The opening comment explains the fix; the grading data must not change."""
        import tomllib
        for name in lab_names():
            packed = self.tars[name][f"mmiolab-{name}/labs/{name}/lab.toml"].decode()
            with open(os.path.join(ROOT, "labs", name, "lab.toml")) as f:
                kit = f.read()
            self.assertEqual(tomllib.loads(packed), tomllib.loads(kit), name)
            self.assertNotIn(kit.split("\n\n")[0], packed, name)

    def test_instructor_edition_still_has_the_answers(self):
        """The same page, built without -t student (test_docs builds it), keeps them."""
        for name in lab_names():
            with open(os.path.join(ROOT, "Documentation", "labs", f"{name}.rst")) as f:
                self.assertIn(".. only:: instructor", f.read(), name)

    def test_shared_files_are_packed_as_files(self):
        """modern borrows doorbell's test program and header (symlinks in the kit)."""
        files = self.tars["modern"]
        with open(os.path.join(ROOT, "labs", "doorbell", "tests", "ringtest.c"), "rb") as f:
            self.assertEqual(files["mmiolab-modern/labs/modern/tests/ringtest.c"], f.read())
        self.assertIn("mmiolab-modern/labs/doorbell/lab.toml", files)   # symbols_from

    def test_same_kit_packs_to_the_same_bytes(self):
        spec = load_lab("doorbell")
        site = os.path.join(self.out, "site")
        a = pack(spec, site, os.path.join(self.tmp.name, "a"), cfg=CFG)
        b = pack(spec, site, os.path.join(self.tmp.name, "b"), cfg=CFG)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            self.assertEqual(fa.read(), fb.read())
        self.assertFalse(os.path.exists(a + ".part"))

    def test_handout_carries_the_built_kernel(self):
        """Students do not build kernels: the kernel image, the initramfs and what a
        module build needs (headers, Module.symvers, the build programs), saying
        which kit built them; the whole handout stays under 40 MB."""
        for name in lab_names():
            top = f"mmiolab-{name}/prebuilt/"
            files = self.tars[name]
            for need in ("kernel/obj/arch/x86/boot/bzImage", "kernel/obj/Module.symvers",
                         "kernel/obj/.config", "kernel/obj/Makefile",
                         "kernel/obj/scripts/mod/modpost", "kernel/obj/scripts/basic/fixdep",
                         "kernel/obj/include/generated/autoconf.h",
                         "kernel/src/Makefile", "kernel/src/include/linux/module.h",
                         "kernel/src/include/linux/mmiosim.h", "kernel/src/scripts/Makefile.build",
                         "kernel/src/arch/x86/include/asm/io.h", "kernel/built-by.json",
                         "initramfs/base.cpio.gz", "initramfs/built-by.json"):
                self.assertIn(top + need, files, f"{name}: prebuilt/{need} missing")
            self.assertFalse([m for m in files if m.startswith(top) and m.endswith((".c", ".o"))
                              and "/scripts/" not in m], name)
            built = json.loads(files[top + "kernel/built-by.json"])
            self.assertRegex(built["kit"], r"^commit [0-9a-f]{12}")
            self.assertEqual(built["config"], kernel.config_digest(TREE))
            self.assertEqual(built["patches"], kernel.patches_digest(CFG.patches))
            self.assertIn(built["kit"], files[f"mmiolab-{name}/HANDOUT.md"].decode())
            # Step 1 names the compiler package of the kernel's major version.
            major = re.search(r"\) (\d+)\.", built["compiler"]).group(1)
            self.assertIn(f"gcc-{major}", files[f"mmiolab-{name}/HANDOUT.md"].decode())
            size = os.path.getsize(os.path.join(self.out, f"mmiolab-{name}.tar.gz"))
            self.assertLess(size, 40e6, name)
            report(f"handout {name}: {size / 1e6:.1f} MB")

    def test_unpacked_handout_grades_the_starter(self):
        """A student's kit, unpacked in a clean folder (no build/ of the kit's),
        self-checks the starter with the kernel it carries (no kernel build,
        no kernel source needed) and fails its race test; the full-kit targets
        say what this is instead of failing obscurely."""
        need_guest(self)
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            # A grader run as root builds as an unprivileged uid (sandbox.py),
            # which must reach the kernel tree: a folder others may enter.
            os.chmod(tmp, 0o755)
            with tarfile.open(os.path.join(self.out, "mmiolab-doorbell.tar.gz")) as tar:
                tar.extractall(tmp, filter="data") if sys.version_info >= (3, 12) \
                    else tar.extractall(tmp)
            kit = os.path.join(tmp, "mmiolab-doorbell")
            env = {k: v for k, v in os.environ.items() if k != "MMIOLAB_BUILD"}
            env["MMIOLAB_KERNEL_TARBALL"] = os.path.join(tmp, "no-kernel-source.tar.xz")
            res = subprocess.run(["make", "-s", "demo"], cwd=kit, env=env, capture_output=True,
                                 text=True, stdin=subprocess.DEVNULL)
            self.assertEqual(res.returncode, 2, res.stdout + res.stderr)
            self.assertIn("student handout", res.stderr)
            res = subprocess.run(["/usr/bin/python3", "-m", "mmiolab", "labstats"], cwd=kit,
                                 env={**env, "PYTHONPATH": "scripts"}, capture_output=True,
                                 text=True, stdin=subprocess.DEVNULL)
            self.assertEqual((res.returncode, res.stderr), (2, "mmiolab: labstats: not in this "
                             "kit (a student handout or an autograder carries no instructor's "
                             "tools)\n"))
            t0 = time.monotonic()
            res = subprocess.run(["make", "-s", "-C", "labs/doorbell", "check"], cwd=kit, env=env,
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                 timeout=600)
            seconds = time.monotonic() - t0
            out = res.stdout + res.stderr
            self.assertFalse(os.path.exists(os.path.join(kit, "build", "kernel")), out[-3000:])
            self.assertIn("kernel: prebuilt by the kit at commit", out)
            self.assertNotIn("kernel: build", out, "the unpacked kit rebuilt the kernel")
            self.assertRegex(out, r"(?m)^  FAILED +race ", out[-3000:])
            score = re.search(r"(?m)^mmiolab doorbell: ringdrv: ([\d.]+)/([\d.]+)$", out)
            self.assertIsNotNone(score, out[-3000:])
            self.assertLess(float(score.group(1)), float(score.group(2)))
            report(f"handout self-check of the starter, in a clean folder: {score.group(0)} "
                   f"in {seconds:.0f}s")


class DepsTest(unittest.TestCase):
    """scripts/deps installs what the command at hand needs: the kit's list in a
    clone, only grading's where the kernel comes built; never another name."""

    def deps(self, top: str, *args: str) -> subprocess.CompletedProcess:
        os.makedirs(os.path.join(top, "scripts"), exist_ok=True)
        with open(os.path.join(ROOT, "scripts", "deps")) as f, \
                open(os.path.join(top, "scripts", "deps"), "w") as out:
            out.write(f.read())
        os.chmod(os.path.join(top, "scripts", "deps"), 0o755)
        env = {k: v for k, v in os.environ.items() if k != "MMIOLAB_BUILD"}
        return subprocess.run([os.path.join(top, "scripts", "deps"), *args], env=env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)

    def test_grading_set_follows_the_kernels_compiler(self):
        with tempfile.TemporaryDirectory() as top:
            res = self.deps(top, "grade")
            self.assertEqual(res.returncode, 1)
            self.assertIn("no built lab kernel here", res.stderr)
            obj = os.path.join(top, "prebuilt", "kernel", "obj")
            os.makedirs(obj)
            with open(os.path.join(obj, ".config"), "w") as f:
                f.write("CONFIG_GCC_VERSION=120200\n")
            # This machine (Debian 12) has every package of the grading set.
            res = self.deps(top, "grade")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("all 9 packages present", res.stdout)
            with open(os.path.join(obj, ".config"), "w") as f:
                f.write("CONFIG_GCC_VERSION=990100\n")
            res = self.deps(top, "grade")       # gcc-99 is not installed: apt is needed
            self.assertNotIn("all 9 packages present", res.stdout)
            self.assertIn("gcc-99", res.stdout + res.stderr)

    def test_unknown_set_is_refused(self):
        with tempfile.TemporaryDirectory() as top:
            res = self.deps(top, "everything")
            self.assertEqual(res.returncode, 1)
            self.assertIn("unknown set 'everything'", res.stderr)

    def test_handout_make_deps_asks_for_the_grading_set(self):
        res = subprocess.run(["make", "-n", "deps"], cwd=ROOT, capture_output=True, text=True)
        self.assertIn("scripts/deps kit", res.stdout)
        with tempfile.TemporaryDirectory() as top:
            os.makedirs(os.path.join(top, "prebuilt", "kernel"))
            with open(os.path.join(ROOT, "Makefile")) as f, \
                    open(os.path.join(top, "Makefile"), "w") as out:
                out.write(f.read())
            res = subprocess.run(["make", "-n", "deps"], cwd=top, capture_output=True, text=True)
            self.assertIn("scripts/deps grade", res.stdout)


if __name__ == "__main__":
    unittest.main()


class TemplateTest(unittest.TestCase):
    """The files the kit writes from templates/ (template.fill)."""

    def test_a_missing_value_or_a_stray_at_sign_is_an_error(self):
        from mmiolab import template
        with tempfile.TemporaryDirectory() as d:
            for name, text in (("ok", "a @x@ b $y ${z} @@ c\n"), ("stray", "mail me@host\n")):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            old, template.TEMPLATES = template.TEMPLATES, d
            try:
                self.assertEqual(template.fill("ok", x="1"), "a 1 b $y ${z} @ c\n")
                with self.assertRaises(KeyError):
                    template.fill("ok")
                with self.assertRaises(ValueError):
                    template.fill("stray")
            finally:
                template.TEMPLATES = old

    def test_every_template_is_used(self):
        from mmiolab import template
        code = ""
        for top, _, names in os.walk(os.path.join(ROOT, "scripts", "mmiolab")):
            for name in names:
                if name.endswith(".py"):
                    with open(os.path.join(top, name), encoding="utf-8") as f:
                        code += f.read()
        for name in os.listdir(template.TEMPLATES):
            self.assertIn(f'"{name}"', code, f"templates/{name} is not used")
