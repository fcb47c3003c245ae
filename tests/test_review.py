"""What the instructor sees of a submission's code (issue 24): the diff against
the starter, flags for changes outside the functions a fix touches and for
kernel-memory walking, and an allow-list without the unchecked user-copy
helpers. Host only: sources and the labs' own fixes, no build."""

import glob
import os
import subprocess
import tempfile
import unittest

from mmiolab import ROOT, labspec, objcheck
from kitcfg import CFG

LABS = os.path.join(ROOT, "labs")


def starter(lab="doorbell"):
    spec = labspec.load_lab(lab)
    with open(os.path.join(spec.dir, "starter", spec.files[0])) as f:
        return f.read()


def patched(base, patch):
    res = subprocess.run(["patch", "-o", "-", "-s", base, patch], capture_output=True,
                         text=True, check=True)
    return res.stdout


FIX_LINE = "\twritel(rd->tail, rd->regs + MMIOSIM_RING_DOORBELL);\n"


def in_post(code, decl=""):
    """The doorbell starter with code after the doorbell write (in ringdrv_post)
    and decl before it, at file scope."""
    s = starter()
    assert s.count(FIX_LINE) == 1
    s = s.replace(FIX_LINE, FIX_LINE + code, 1)
    at = s.index("static void ringdrv_post(")
    return s[:at] + decl + s[at:]


# Ring-0 tricks from the issue, as a student would write them in the fix's
# function: each must be flagged (the module may still run; flags change no score).
WALKERS = {
    "direct map from a kmalloc pointer": (
        "\t{\n\t\tvoid *p = kmalloc(8, GFP_ATOMIC);\n"
        "\t\tunsigned long base = (unsigned long)p & ~((1UL << 39) - 1);\n"
        "\t\tkfree(p);\n\t\t(void)base;\n\t}\n", "integer casts of pointers"),
    "__get_user() on a kernel address": (
        "\t{\n\t\tu64 v;\n\t\t__get_user(v, (u64 __user *)rd);\n\t}\n", "user-copy helpers"),
    "page cache of /job through current->fs": (
        "\t{\n\t\tstruct path pwd = current->fs->pwd;\n\t\t(void)pwd;\n\t}\n",
        "current->fs, current->mm"),
    "page_offset_base and __va": (
        "\t{\n\t\tvoid *v = __va(0x100000);\n\t\t(void)v; (void)page_offset_base;\n\t}\n",
        "direct-map or page arithmetic"),
    "scanning loop over raw memory": (
        "\t{\n\t\tchar *q;\n\t\tfor (q = (char *)rd; q < (char *)rd + 4096; q += 8)\n"
        "\t\t\tif (*(u64 *)q == 0x736e6f6972)\n\t\t\t\tbreak;\n\t}\n", "memory scanning"),
    "fabric parameters by address": (
        "\t*(volatile u32 *)0xffffffff82345678UL = 0;\n", "memory scanning"),
}


def edited(*pairs):
    """The doorbell starter with each (old, new) replaced once (old must be there)."""
    s = starter()
    for old, new in pairs:
        assert s.count(old) >= 1, old
        s = s.replace(old, new, 1)
    return s


FIX = (FIX_LINE, FIX_LINE + "\tmmiowb();\n")
POST_HEAD = "static void ringdrv_post(struct ringdrv *rd, struct ringdrv_req *req, u64 payload)\n{\n"
PROBE_END = "\tdev_info(dev, \"ring of %d descriptors, irq %d\\n\", RING_ENTRIES, irq);\n\treturn 0;\n}\n"
WALK = ("\t{\n\t\tu8 *p = (u8 *)&dev_err_probe;\n\n"
        "\t\tp[0x1f2e3d] = 1;\t/* the fabric's settings, found by hand */\n\t}\n")
WALK_NO_CAST = ("\t{\n\t\tvoid *p = &dev_err_probe;\n\t\tu8 *q = p;\n\n"
                "\t\tq += 0x1f2e3d;\n\t\t*q = 1;\n\t}\n")
POKE = ("\tcase 0x7a00:\t/* any register, from user space */\n"
        "\t\twritel(lower_32_bits(arg), rd->regs + (arg >> 32));\n\t\treturn 0;\n")
IOCTL_CASE = "\tcase RINGDRV_STATS:\n"

# Honest changes a student would write, fresh from the starter (issue 33): none
# may raise a flag. Each also carries the fix, as a submission would.
HONEST = {
    "the fix alone (mmiowb() before the unlock)": edited(FIX),
    "a new helper holding the fix": edited(
        (FIX_LINE, "\tringdrv_kick(rd);\n"),
        ("/*\n * Queue one request", "static void ringdrv_kick(struct ringdrv *rd)\n{\n"
         "\twritel(rd->tail, rd->regs + MMIOSIM_RING_DOORBELL);\n\tmmiowb();\n}\n\n"
         "/*\n * Queue one request")),
    "container_of in the ioctl": edited(
        FIX, ("\tstruct ringdrv *rd = the_ring;\n",
              "\tstruct ringdrv *rd = container_of(file->private_data, struct ringdrv, misc);\n")),
    "pr_info in probe": edited(
        FIX, ("\tplatform_set_drvdata(pdev, rd);\n", "\tplatform_set_drvdata(pdev, rd);\n"
              "\tpr_info(\"bound %s, irq %d\\n\", dev_name(dev), irq);\n")),
    "a macro": edited(
        (FIX_LINE, FIX_LINE + "\tRINGDRV_ORDER_DOORBELL();\n"),
        ("#define RING_ENTRIES\t64\n", "#define RING_ENTRIES\t64\n"
         "#define RINGDRV_ORDER_DOORBELL()\tmmiowb()\t/* before the unlock */\n")),
    "a debug field in the struct": edited(
        FIX, ("\tstruct miscdevice misc;\n", "\tstruct miscdevice misc;\n"
              "\tunsigned long kicks;\t\t/* debug: doorbells rung */\n"),
        ("\trd->busy++;\n", "\trd->busy++;\n\trd->kicks++;\n")),
    "a (u64) cast in pr_debug": edited(
        (FIX_LINE, FIX_LINE + "\tpr_debug(\"doorbell %u, ring at %llx\\n\", rd->tail,\n"
                              "\t\t (u64)rd->desc_dma);\n\tmmiowb();\n")),
    "a debug print under #ifdef DEBUG": edited(
        (FIX_LINE, FIX_LINE + "#ifdef DEBUG\n\tpr_info(\"tail %u\\n\", rd->tail);\n#endif\n"
                              "\tmmiowb();\n")),
    "the starter's user copies moved to a helper": edited(
        FIX, ("\t\tif (copy_from_user(&batch, (void __user *)arg, sizeof(batch)))\n",
              "\t\tif (ringdrv_get_batch(&batch, arg))\n"),
        ("static long ringdrv_ioctl(", "static int ringdrv_get_batch(struct ringdrv_batch *b, "
         "unsigned long arg)\n{\n\treturn copy_from_user(b, (void __user *)arg, sizeof(*b));"
         "\n}\n\nstatic long ringdrv_ioctl(")),
}

# Tricks, fresh from the starter: each must be flagged, and the words of the
# flag say what was seen.
TRICKS = {
    "a walk from an import's address, in a fix function": (
        edited(FIX, (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\n" + WALK)),
        "kernel-memory walking?"),
    "the same walk with no cast at all": (
        edited(FIX, (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\n" + WALK_NO_CAST)),
        "the address of a symbol the file never declares"),
    "a register-poking ioctl (outside the fix)": (
        edited(FIX, (IOCTL_CASE, POKE + IOCTL_CASE)),
        "changes outside the functions a fix touches (ringdrv_irq, ringdrv_post, "
        "ringdrv_queue): ringdrv_ioctl"),
    "the same, moved into a fix function by braces under a never-defined #ifdef": (
        edited(FIX, (POST_HEAD, POST_HEAD + "#ifdef RINGDRV_NEVER_DEFINED\n\t{\n#endif\n"),
               (IOCTL_CASE, POKE + "#ifdef RINGDRV_NEVER_DEFINED\n\t}\n#endif\n" + IOCTL_CASE)),
        "braces that do not balance"),
    "a function hidden by a macro that closes the fix function": (
        edited(FIX, ("#define RING_ENTRIES\t64\n", "#define RING_ENTRIES\t64\n"
                     "#define RINGDRV_DONE }\n"),
               (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\nRINGDRV_DONE\n\n"
                "static void ringdrv_poke(struct ringdrv *rd, u32 v)\n{\n"
                "\twritel(v, rd->regs + MMIOSIM_RING_SIZE);\n")),
        "a macro with unbalanced braces"),
    "_copy_from_user (one underscore) in a fix function": (
        edited(FIX, (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\n"
                     "\t{\n\t\tu64 v;\n\n\t\tif (_copy_from_user(&v, (const void __user *)"
                     "rd->desc, sizeof(v)))\n\t\t\tv = 0;\n\t}\n")),
        "user-copy helpers (a fix needs none): _copy_from_user"),
    "__copy_from_user_inatomic in a fix function": (
        edited(FIX, (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\n"
                     "\t{\n\t\tu64 v;\n\n\t\t(void)__copy_from_user_inatomic(&v, "
                     "(const void __user *)rd->desc, sizeof(v));\n\t}\n")),
        "user-copy helpers (a fix needs none): __copy_from_user_inatomic"),
    "an extra copy_to_user (the starter's spelling)": (
        edited(FIX, (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\n"
                     "\tif (copy_to_user((void __user *)rd->desc, rd, 8))\n\t\treturn;\n")),
        "user-copy helpers (a fix needs none): copy_to_user"),
    "an integer cast of a pointer outside any print": (
        edited(FIX, (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\n"
                     "\trd->stats.submitted += (unsigned long)rd & 0;\n")),
        "integer casts of pointers"),
    "a trick under a conditional the compiler takes (CONFIG_X86)": (
        edited(FIX, (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\n"
                     "#ifdef CONFIG_X86\n" + WALK + "#endif\n")),
        "kernel-memory walking?"),
}


class FlagTableTest(unittest.TestCase):
    """Issue 33's table: honest changes raise no flag, tricks are flagged; the
    closing note gives the same table before the change."""

    def test_honest_changes_raise_no_flag(self):
        spec = labspec.load_lab("doorbell")
        for label, text in HONEST.items():
            with self.subTest(label):
                r = objcheck.review(starter(), text, spec.fix_functions)
                self.assertEqual(r.flags, [])
                self.assertTrue(r.functions)

    def test_tricks_are_flagged(self):
        spec = labspec.load_lab("doorbell")
        for label, (text, what) in TRICKS.items():
            with self.subTest(label):
                r = objcheck.review(starter(), text, spec.fix_functions)
                self.assertTrue(any(what in f for f in r.flags), r.flags)


# A kernel as the review sees one (objcheck.KernelMacros): CONFIG_X86 set,
# CONFIG_KASAN not, and mmiowb a macro of its headers.
KERNEL = objcheck.KernelMacros({"CONFIG_X86": "y", "CONFIG_HZ": "250"},
                               frozenset({"mmiowb", "CONFIG_X86", "CONFIG_HZ"}))


class PreprocessorTest(unittest.TestCase):
    """The review reads what the compiler reads (objcheck.live_code)."""

    def live(self, src, kernel=KERNEL):
        code, flags, _ = objcheck.live_code(src, kernel)
        return [i + 1 for i, ln in enumerate(code.split("\n")) if ln.strip() == "x;"], flags

    def test_branches_the_compiler_drops_are_dropped(self):
        cases = {
            "#if 0\nx;\n#else\nx;\n#endif\n": [4],
            "#ifdef NEVER_DEFINED\nx;\n#endif\nx;\n": [4],
            "#define ON 1\n#if ON && defined(CONFIG_X86)\nx;\n#endif\n": [3],
            "#if IS_ENABLED(CONFIG_KASAN)\nx;\n#elif CONFIG_HZ > 100\nx;\n#else\nx;\n#endif\n": [4],
            "#define D\n#undef D\n#ifndef D\nx;\n#endif\n": [4],
            "#if 0\n#if 1\nx;\n#endif\nx;\n#endif\nx;\n": [7],
            "#ifdef CONFIG_KASAN\nx;\n#endif\n": [],
            # Undecided (a header's macro): both branches read.
            "#ifdef mmiowb\nx;\n#else\nx;\n#endif\n": [2, 4],
            "#if defined(mmiowb) || 1\nx;\n#endif\n": [2],
            "#if defined(mmiowb) && 0\nx;\n#endif\n": [],
        }
        for src, want in cases.items():
            with self.subTest(src):
                self.assertEqual(self.live(src), (want, []))

    def test_without_the_kernel_a_name_not_in_the_file_is_undecided(self):
        self.assertEqual(self.live("#ifdef NEVER_DEFINED\nx;\n#endif\n", None), ([2], []))

    def test_braces_that_could_move_code_are_flagged(self):
        lines, flags = self.live("#ifdef mmiowb\n{\n#endif\nx;\n", KERNEL)
        self.assertEqual(lines, [4])
        self.assertIn("braces that do not balance (line 1)", flags[0])
        _, flags = self.live("#define OPEN {\n#define CALL(f) f(\nx;\n")
        self.assertEqual(flags, ["a macro with unbalanced braces or parentheses: CALL (it moves "
                                 "code between functions)",
                                 "a macro with unbalanced braces or parentheses: OPEN (it moves "
                                 "code between functions)"])

    def test_the_kernels_macros_decide_the_never_defined_brace_trick(self):
        """With the lab kernel's macros the hidden braces are dead code, as to
        the compiler: the backdoor is seen where it is, in ringdrv_ioctl."""
        spec = labspec.load_lab("doorbell")
        text, _ = TRICKS["the same, moved into a fix function by braces under a never-defined "
                         "#ifdef"]
        r = objcheck.review(starter(), text, spec.fix_functions, kernel=KERNEL)
        self.assertEqual(r.flags, ["changes outside the functions a fix touches (ringdrv_irq, "
                                   "ringdrv_post, ringdrv_queue): ringdrv_ioctl"])
        # A trick under a configuration the kernel does not have is not compiled.
        dead = edited(FIX, (FIX_LINE + "\tmmiowb();\n", FIX_LINE + "\tmmiowb();\n"
                            "#ifdef CONFIG_KASAN\n" + WALK + "#endif\n"))
        self.assertEqual(objcheck.review(starter(), dead, spec.fix_functions,
                                         kernel=KERNEL).flags, [])

    def test_a_kernel_s_macros_are_read_from_its_headers(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "include", "linux"))
            with open(os.path.join(d, "include", "linux", "a.h"), "w") as f:
                f.write("#ifndef A_H\n# define A_H\n#define mmiowb() do { } while (0)\n#endif\n")
            with open(os.path.join(d, "autoconf.h"), "w") as f:
                f.write("#define CONFIG_X86 1\n#define CONFIG_E1000_MODULE 1\n"
                        "#define CONFIG_HZ 250\n")
            k = objcheck.kernel_macros([os.path.join(d, "include")], os.path.join(d, "autoconf.h"))
        self.assertEqual(k.config, {"CONFIG_X86": "y", "CONFIG_E1000": "m", "CONFIG_HZ": "250"})
        self.assertEqual(k.defined, {"A_H", "mmiowb"})
        self.assertEqual(objcheck.KernelMacros.from_dict(k.to_dict()), k)


class BoundedTest(unittest.TestCase):
    """Every step that reads the submission's text runs in a bounded child
    (objcheck.check_text), with linear patterns."""

    def test_the_checks_run_in_a_child_and_say_so_when_stopped(self):
        spec = labspec.load_lab("doorbell")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ringdrv.c")
            with open(path, "w") as f:
                f.write(TRICKS["_copy_from_user (one underscore) in a fix function"][0]
                        + "asm(\"nop\");\n")
            base = os.path.join(spec.dir, "starter", "ringdrv.c")
            hints, rev = objcheck.check_text(path, base, spec.fix_functions)
            self.assertEqual(hints, ["the source uses inline assembly"])
            self.assertIn("_copy_from_user", rev.flags[-1])
            self.assertIn("+asm(", rev.diff)
            hints, rev = objcheck.check_text(path, base, spec.fix_functions, timeout=0.01)
            self.assertRegex(hints[0], r"^the source was not checked: reading it took more than")
            self.assertEqual((rev.flags, rev.diff), ([], ""))

    def test_a_megabyte_of_newlines_gets_a_verdict(self):
        """It took the patterns' quadratic time (104 s for 150 KB); now each
        check is linear and the review's line lookup too."""
        text = "\n" * (1 << 20)
        self.assertEqual(objcheck.source_flags(text), [])
        self.assertEqual(objcheck.review(starter(), text[:19999], ("ringdrv_post",)).flags, [])
        # The per-line function lookup: 6,000 functions, 20,000 lines.
        many = "".join(f"static void f{i}(void) {{ }}\n" for i in range(6000)) + "\n" * 13000
        r = objcheck.review(starter(), many, ("ringdrv_post",))
        self.assertGreaterEqual(len(r.functions), 6000)
        self.assertEqual(objcheck.live_code("#if 1\n{\n" * 5000 + "#endif\n" * 5000)[1], [])
        # One long identifier: a pattern that started inside it at every
        # position was quadratic.
        r = objcheck.review(starter(), "a" * 200000 + "(\n", ("ringdrv_post",))
        self.assertEqual(r.flags, ["changes outside the functions a fix touches "
                                   "(ringdrv_post): file-scope code"])


class ReviewTest(unittest.TestCase):
    def test_each_walker_is_flagged(self):
        spec = labspec.load_lab("doorbell")
        for label, (code, what) in WALKERS.items():
            with self.subTest(label):
                r = objcheck.review(starter(), in_post(code), spec.fix_functions)
                walking = [f for f in r.flags if f.startswith("kernel-memory walking?")]
                self.assertTrue(any(what in f for f in walking), r.flags)
                self.assertEqual(r.functions, ["ringdrv_post"])
                self.assertIn("+" + code.split("\n")[0], r.diff)

    def test_the_starter_s_own_user_copies_are_not_flagged(self):
        spec = labspec.load_lab("doorbell")
        r = objcheck.review(starter(), in_post("\tmmiowb();\n"), spec.fix_functions)
        self.assertEqual(r.flags, [])
        self.assertEqual((r.functions, r.changed), (["ringdrv_post"], 1))
        self.assertTrue(r.diff.startswith("--- starter/ringdrv.c\n+++ ringdrv.c\n@@ "))

    def test_changes_outside_the_fix_are_flagged(self):
        spec = labspec.load_lab("doorbell")
        s = starter().replace("static int ringdrv_probe(struct platform_device *pdev)\n{\n",
                              "static int ringdrv_probe(struct platform_device *pdev)\n{\n"
                              "\tmsleep(1);\n", 1)
        s = s.replace("static void ringdrv_post(", "extern int hooked;\n"
                      "static void ringdrv_post(", 1)
        r = objcheck.review(starter(), s, spec.fix_functions)
        self.assertEqual(r.flags, ["changes outside the functions a fix touches (ringdrv_irq, "
                                   "ringdrv_post, ringdrv_queue): ringdrv_probe, "
                                   "file-scope code"])

    def test_comments_blank_lines_and_kernel_includes_are_not_changes(self):
        spec = labspec.load_lab("doorbell")
        s = "#include <linux/delay.h>\n" + starter().replace(
            "static int ringdrv_probe(", "/* a comment, ringdrv_probe( */\n\n"
            "static int ringdrv_probe(", 1)
        r = objcheck.review(starter(), s, spec.fix_functions)
        self.assertEqual((r.flags, r.functions), ([], []))

    def test_huge_sources_are_not_diffed(self):
        r = objcheck.review(starter(), "\n" * 30000)
        self.assertEqual(r.flags, ["the source has 30001 lines: not compared with the starter"])

    def test_the_labs_fixes_stay_inside_their_functions(self):
        """Every solution, correct variant and wrong-fix fixture of every lab
        changes only fix_functions, and raises no flag."""
        for lab in labspec.lab_names():
            spec = labspec.load_lab(lab)
            base = spec.fixture_base_source(CFG)
            self.assertTrue(spec.fix_functions, lab)
            names = [f for f, _, _ in objcheck.functions(objcheck._code_only(starter(lab)))]
            self.assertLessEqual(set(spec.fix_functions), set(names), lab)
            sources = {spec.solution_patch(n): open(spec.solution_source(n, CFG)).read()
                       for n in spec.solutions}
            for p in sorted(glob.glob(os.path.join(spec.dir, "correct", "*.patch")) +
                            glob.glob(os.path.join(spec.dir, "fixtures", "*.patch"))):
                sources[p] = patched(base, p)
            self.assertGreater(len(sources), 5, lab)
            for p, text in sources.items():
                with self.subTest(os.path.relpath(p, LABS)):
                    r = objcheck.review(starter(lab), text, spec.fix_functions)
                    self.assertEqual(r.flags, [])
                    self.assertTrue(r.functions)


class AllowListTest(unittest.TestCase):
    def test_no_unchecked_user_copy_helper(self):
        for lab in labspec.lab_names():
            spec = labspec.load_lab(lab)
            with self.subTest(lab):
                for sym in ("__get_user_nocheck_8", "__get_user_nocheck_1",
                            "__put_user_nocheck_8", "copy_from_kernel_nofault"):
                    self.assertFalse(spec.symbol_allowed(sym), sym)
                for sym in ("_copy_from_user", "_copy_to_user", "__get_user_8",
                            "__put_user_4"):
                    self.assertTrue(spec.symbol_allowed(sym), sym)
                self.assertFalse(any("user" in s and "*" in s for s in spec.symbols))


if __name__ == "__main__":
    unittest.main()
