"""What the instructor sees of a submission's code (issue 24): the diff against
the starter, flags for changes outside the functions a fix touches and for
kernel-memory walking, and an allow-list without the unchecked user-copy
helpers. Host only: sources and the labs' own fixes, no build."""

import glob
import os
import subprocess
import unittest

from mmiolab import ROOT, labspec, objcheck

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
                              "\tpr_err(\"probe\\n\");\n", 1)
        s = s.replace("static void ringdrv_post(", "static int hooked;\n"
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
            base = spec.fixture_base_source()
            self.assertTrue(spec.fix_functions, lab)
            names = [f for f, _, _ in objcheck.functions(objcheck._code_only(starter(lab)))]
            self.assertLessEqual(set(spec.fix_functions), set(names), lab)
            sources = {spec.solution_patch(n): open(spec.solution_source(n)).read()
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
