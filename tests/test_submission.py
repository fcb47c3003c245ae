"""Submission intake against a corpus of bad submissions built here, plus the
per-lab data (labspec) that intake and the grader read.

The corpus is generated in a temporary folder by the tests themselves (no
committed binaries): every entry is one hostile or broken submission and the
verdict it must get. After the whole corpus has gone through intake, a
snapshot of everything outside the scratch folders must be unchanged and no
file may have appeared where a traversal tried to put one.
"""

import dataclasses
import hashlib
import io
import os
import stat
import tarfile
import tempfile
import textwrap
import unittest
import zipfile
from unittest import mock

from mmiolab import labspec, roster, sandbox
from mmiolab import submission as sub
from mmiolab.config import Config
from kitcfg import CFG

SRC = b"// SPDX-License-Identifier: GPL-2.0\n#include <linux/module.h>\nMODULE_LICENSE(\"GPL\");\n"
ALLOWED = ["ringdrv.c"]
SMALL = sub.IntakeLimits(max_file_bytes=4096, max_members=50, max_total_bytes=1 << 20,
                         max_archive_bytes=8 << 20)


# ---------------------------------------------------------------------------- builders

def reg(name, data=SRC):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mode = 0o644
    return ti, data


def link(name, target, kind):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = target
    return ti, None


def special(name, kind):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.devmajor, ti.devminor = 1, 3
    return ti, None


def make_tar(path, members, mode="w:gz", fmt=tarfile.GNU_FORMAT):
    with tarfile.open(path, mode, format=fmt) as t:
        for ti, data in members:
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    return path


def make_zip(path, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for m in members:
            if isinstance(m, zipfile.ZipInfo):
                z.writestr(m, b"/etc/passwd")
            else:
                name, data = m
                z.writestr(name, data)
    return path


def make_dir(path, files):
    os.makedirs(path)
    for name, data in files.items():
        full = os.path.join(path, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
    return path


def snapshot(root, skip):
    """Every path under root (not following links) with its type, size and content hash."""
    out = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
        for name in dirs + files:
            full = os.path.join(folder, name)
            st = os.lstat(full)
            digest = ""
            if stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(full, root)] = (stat.S_IFMT(st.st_mode), st.st_size, digest)
    return out


# ---------------------------------------------------------------------------- corpus

def build_corpus(d):
    """[(label, path, limits, expected verdict, expected ignored reasons)]."""
    C = []

    def add(label, path, verdict, reasons=(), limits=sub.DEFAULT_LIMITS):
        C.append((label, path, limits, verdict, set(reasons)))

    j = lambda *p: os.path.join(d, *p)
    # accepted
    add("plain .c file under another name", make_dir(j("plain"), {"alice.c": SRC}) and
        j("plain", "alice.c"), sub.OK)
    add("folder with Makefile and Kbuild", make_dir(j("folder"), {
        "ringdrv.c": SRC, "Makefile": b"obj-m += evil.o\n", "Kbuild": b"obj-m := x.o\n",
        "notes.txt": b"hi\n"}), sub.OK, {sub.BUILD_FILE, sub.NOT_ALLOWED})
    add("tar.gz with a single top-level folder", make_tar(j("nested.tar.gz"), [
        reg("student/ringdrv.c"), reg("student/README.md", b"# readme\n")]), sub.OK,
        {sub.NOT_ALLOWED})
    add("zip with a single top-level folder and macOS junk", make_zip(j("nested.zip"), [
        ("student/ringdrv.c", SRC), ("__MACOSX/student/._ringdrv.c", b"\0\5\26\7"),
        ("student/.DS_Store", b"\0\0\0\1Bud1")]), sub.OK, {sub.METADATA})
    add("traversal entries next to a good file are ignored", make_tar(j("trav-mixed.tgz"), [
        reg("ringdrv.c"), reg("../../sentinel/pwned", b"x"),
        reg("../../../../../../../../tmp/mmiolab-pwned", b"x")]), sub.OK, {sub.TRAVERSAL})
    # refused: unsafe entries
    add("tar with ../ringdrv.c", make_tar(j("traversal.tgz"), [reg("../ringdrv.c")]),
        sub.TRAVERSAL, {sub.TRAVERSAL})
    add("tar with ..\\ringdrv.c (Windows separator)", make_tar(j("traversal-bs.tar"), [
        reg("..\\ringdrv.c")], mode="w"), sub.TRAVERSAL, {sub.TRAVERSAL})
    add("tar with an absolute path", make_tar(j("absolute.tgz"), [reg("/tmp/ringdrv.c")]),
        sub.ABSOLUTE, {sub.ABSOLUTE})
    add("zip with ../ringdrv.c", make_zip(j("traversal.zip"), [("../ringdrv.c", SRC)]),
        sub.TRAVERSAL, {sub.TRAVERSAL})
    add("tar with a symlink ringdrv.c -> /etc/passwd", make_tar(j("symlink.tgz"), [
        link("ringdrv.c", "/etc/passwd", tarfile.SYMTYPE)]), sub.SYMLINK, {sub.SYMLINK})
    add("tar with a hardlink ringdrv.c -> /etc/shadow", make_tar(j("hardlink.tgz"), [
        link("ringdrv.c", "/etc/shadow", tarfile.LNKTYPE)]), sub.HARDLINK, {sub.HARDLINK})
    add("tar with a character device", make_tar(j("chardev.tgz"), [
        special("ringdrv.c", tarfile.CHRTYPE)]), sub.SPECIAL, {sub.SPECIAL})
    add("tar with a fifo", make_tar(j("fifo.tgz"), [special("ringdrv.c", tarfile.FIFOTYPE)]),
        sub.SPECIAL, {sub.SPECIAL})
    zl = zipfile.ZipInfo("ringdrv.c")
    zl.create_system = 3
    zl.external_attr = (stat.S_IFLNK | 0o777) << 16
    add("zip with a symlink entry", make_zip(j("symlink.zip"), [zl]), sub.SYMLINK,
        {sub.SYMLINK})
    link_dir = make_dir(j("linkdir"), {})
    os.symlink("/etc/passwd", os.path.join(link_dir, "ringdrv.c"))
    add("folder whose ringdrv.c is a symlink", link_dir, sub.SYMLINK, {sub.SYMLINK})
    fifo_dir = make_dir(j("fifodir"), {})
    os.mkfifo(os.path.join(fifo_dir, "ringdrv.c"))
    add("folder whose ringdrv.c is a fifo (would block a naive reader)", fifo_dir,
        sub.SPECIAL, {sub.SPECIAL})
    os.symlink(j("folder"), j("student-link"))
    add("the submission itself is a symlink", j("student-link"), sub.SYMLINK)
    # refused: sizes and bombs
    add("ringdrv.c over the per-file cap", make_dir(j("huge"), {
        "ringdrv.c": SRC + b"/*" + b"x" * (1 << 20) + b"*/\n"}), sub.TOO_LARGE, {sub.TOO_LARGE})
    bomb = j("bomb.zip")
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ringdrv.c", SRC)
        z.writestr("zeros.bin", b"\0" * (4 << 20))        # 4 MiB -> a few KiB
    add("zip bomb: members expand past the total cap", bomb, sub.ARCHIVE_TOO_LARGE,
        limits=SMALL)
    add("zip with too many members", make_zip(j("many.zip"), [
        (f"f{i}.txt", b"x") for i in range(80)] + [("ringdrv.c", SRC)]), sub.TOO_MANY,
        limits=SMALL)
    add("tar with too many members", make_tar(j("many.tgz"), [
        reg(f"f{i}.txt", b"x") for i in range(80)] + [reg("ringdrv.c")]), sub.TOO_MANY,
        limits=SMALL)
    pax = tarfile.TarInfo("ringdrv.c")
    pax.size = len(SRC)
    pax.pax_headers = {"comment": "A" * (6 << 20)}         # 6 MiB header, gzips to KiBs
    add("tar.gz bomb hidden in a pax header", make_tar(j("paxbomb.tgz"), [(pax, SRC)],
                                                        fmt=tarfile.PAX_FORMAT),
        sub.ARCHIVE_TOO_LARGE, limits=SMALL)
    # refused: contents and names
    add("binary ringdrv.c (an object file)", make_tar(j("binary.tgz"), [
        reg("ringdrv.c", b"\x7fELF\x02\x01\x01\0\0\0\0\0")]), sub.BINARY, {sub.BINARY})
    add("ringdrv.c in Latin-1", make_dir(j("latin1"), {
        "ringdrv.c": "/* r\u00e9sum\u00e9 */\n".encode("latin-1") + SRC}), sub.NOT_UTF8,
        {sub.NOT_UTF8})
    add("non-UTF-8 file name", make_tar(j("badname.tar"), [
        reg("ring\udcffdrv.c".encode("utf-8", "surrogateescape").decode(
            "utf-8", "surrogateescape"))], mode="w"), sub.MISSING, {sub.BAD_NAME})
    zbad = j("badname.zip")
    make_zip(zbad, [("ringXdrv.c", SRC)])
    with open(zbad, "rb") as f:
        raw = f.read()
    with open(zbad, "wb") as f:
        f.write(raw.replace(b"ringXdrv.c", b"ring\xffdrv.c"))
    add("zip with a non-UTF-8 file name", zbad, sub.MISSING, {sub.BAD_NAME})
    add("Makefile and Kbuild only", make_tar(j("buildonly.tgz"), [
        reg("Makefile", b"all:\n\trm -rf /\n"), reg("Kbuild", b"obj-m := x.o\n")]),
        sub.MISSING, {sub.BUILD_FILE})
    add("wrong case: RingDrv.c", make_zip(j("case.zip"), [("RingDrv.c", SRC)]), sub.MISSING,
        {sub.NOT_ALLOWED})
    add("two ringdrv.c in different folders", make_tar(j("two.tgz"), [
        reg("v1/ringdrv.c"), reg("v2/ringdrv.c", SRC + b"// v2\n")]), sub.AMBIGUOUS)
    with zipfile.ZipFile(j("dup.zip"), "w") as z:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            z.writestr("ringdrv.c", SRC)
            z.writestr("ringdrv.c", SRC + b"// again\n")
    add("zip with the same name twice", j("dup.zip"), sub.AMBIGUOUS)
    add("a binary ringdrv.c next to a good one is still ambiguous", make_tar(j("two-bin.tgz"), [
        reg("ringdrv.c"), reg("old/ringdrv.c", b"\0\0\0")]), sub.AMBIGUOUS)
    add("empty tar", make_tar(j("empty.tgz"), []), sub.EMPTY)
    with zipfile.ZipFile(j("empty.zip"), "w"):
        pass
    add("empty zip", j("empty.zip"), sub.EMPTY)
    open(j("zero.tar.gz"), "wb").close()
    add("zero-byte archive", j("zero.tar.gz"), sub.EMPTY)
    add("empty ringdrv.c", make_dir(j("emptyc"), {"ringdrv.c": b""}), sub.EMPTY, {sub.EMPTY})
    with open(j("corrupt.tar.gz"), "wb") as f:
        f.write(b"\x1f\x8b\x08\x00" + os.urandom(300))
    add("corrupt gzip", j("corrupt.tar.gz"), sub.CORRUPT)
    good = make_zip(j("trunc-src.zip"), [("ringdrv.c", SRC * 50)])
    with open(good, "rb") as f:
        raw = f.read()
    with open(j("truncated.zip"), "wb") as f:
        f.write(raw[:len(raw) // 2])
    add("truncated zip", j("truncated.zip"), sub.CORRUPT)
    gz = make_tar(j("trunc-src.tgz"), [reg("ringdrv.c", os.urandom(3000).hex().encode())])
    with open(gz, "rb") as f:
        raw = f.read()
    with open(j("truncated.tgz"), "wb") as f:
        f.write(raw[:len(raw) - 40])
    add("truncated tar.gz", j("truncated.tgz"), sub.CORRUPT)
    with open(j("homework.rar"), "wb") as f:
        f.write(b"Rar!\x1a\x07\x00" + b"\0" * 40)
    add("unsupported archive type", j("homework.rar"), sub.UNSUPPORTED)
    add("missing path", j("no-such-submission"), sub.NOT_FOUND)
    return C


class CorpusTest(unittest.TestCase):
    """Each bad submission gets its verdict; nothing outside scratch changes."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="mmiolab-corpus-")
        root = cls.tmp.name
        cls.root = root
        cls.corpus_dir = os.path.join(root, "corpus")
        os.makedirs(cls.corpus_dir)
        cls.sentinel = make_dir(os.path.join(root, "sentinel"), {"keep.txt": b"do not touch\n"})
        cls.scratch_root = os.path.join(root, "scratch")
        os.makedirs(cls.scratch_root)
        cls.corpus = build_corpus(cls.corpus_dir)
        cls.before = snapshot(root, {cls.scratch_root})
        cls.results = {}
        for i, (label, path, limits, _, _) in enumerate(cls.corpus):
            scratch = os.path.join(cls.scratch_root, f"s{i}")
            cls.results[label] = sub.intake(path, ALLOWED, scratch, limits)
        cls.after = snapshot(root, {cls.scratch_root})

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_corpus_is_big_enough(self):
        bad = [c for c in self.corpus if c[3] != sub.OK]
        self.assertGreaterEqual(len(bad), 15)
        self.assertGreaterEqual(len({c[3] for c in bad}), 12)   # many distinct verdicts

    def test_each_verdict(self):
        for label, path, _, verdict, reasons in self.corpus:
            r = self.results[label]
            with self.subTest(label):
                self.assertEqual(r.verdict, verdict, r.describe())
                self.assertTrue(r.message)
                got = {i.reason for i in r.ignored}
                self.assertTrue(reasons <= got, f"{label}: want {reasons} in {got}")

    def test_accepted_ones_hold_exactly_the_allowed_file(self):
        for label, *_ in self.corpus:
            r = self.results[label]
            with self.subTest(label):
                listing = sorted(os.listdir(r.scratch))
                if r.ok:
                    self.assertEqual(listing, ["ringdrv.c"])
                    self.assertEqual([t.name for t in r.taken], ["ringdrv.c"])
                    with open(r.files()["ringdrv.c"], "rb") as f:
                        self.assertEqual(f.read(), SRC)
                else:
                    self.assertEqual(listing, [], "a refused submission leaves scratch empty")
                    self.assertEqual(r.taken, [])

    def test_nothing_outside_scratch_changed(self):
        self.assertEqual(self.before, self.after)
        self.assertFalse(os.path.exists(os.path.join(self.sentinel, "pwned")))
        self.assertFalse(os.path.lexists("/tmp/mmiolab-pwned"))
        for p in self.sentinel, self.corpus_dir:
            self.assertFalse(os.path.lexists(os.path.join(os.path.dirname(p), "ringdrv.c")))

    def test_scratch_dirs_are_all_inside_scratch_root(self):
        for r in self.results.values():
            self.assertEqual(os.path.dirname(r.scratch), self.scratch_root)
            for t in r.taken:
                self.assertEqual(os.path.dirname(t.path), r.scratch)

    def test_unsafe_entries_are_flagged(self):
        r = self.results["traversal entries next to a good file are ignored"]
        self.assertTrue(r.ok)
        self.assertEqual(len(r.unsafe), 2)
        self.assertIn("path-traversal", r.describe())

    def test_messages_are_plain_and_printable(self):
        for label, *_ in self.corpus:
            text = self.results[label].describe()
            with self.subTest(label):
                self.assertTrue(text.isprintable() or "\n" in text)
                text.encode("utf-8")       # no lone surrogates leak out
        r = self.results["non-UTF-8 file name"]
        self.assertIn("\\xff", r.describe())
        self.assertIn("did you mean ringdrv.c", self.results["wrong case: RingDrv.c"].describe())
        self.assertIn("v1/ringdrv.c", self.results["two ringdrv.c in different folders"].message)


class IntakeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_fresh_scratch_by_default_and_cleanup(self):
        path = make_dir(os.path.join(self.d, "s"), {"ringdrv.c": SRC})
        r = sub.intake(path, ALLOWED)
        try:
            self.assertTrue(r.ok)
            self.assertTrue(os.path.isdir(r.scratch))
        finally:
            sub.cleanup(r)
        self.assertFalse(os.path.exists(r.scratch))

    def test_scratch_must_be_new_or_empty(self):
        path = make_dir(os.path.join(self.d, "s"), {"ringdrv.c": SRC})
        busy = make_dir(os.path.join(self.d, "busy"), {"x": b"1"})
        with self.assertRaises(sub.SubmissionError):
            sub.intake(path, ALLOWED, busy)
        os.symlink(busy, os.path.join(self.d, "ln"))
        with self.assertRaises(sub.SubmissionError):
            sub.intake(path, ALLOWED, os.path.join(self.d, "ln"))

    def test_deep_nesting_is_fine_when_unique(self):
        path = make_tar(os.path.join(self.d, "deep.tgz"), [reg("a/b/c/d/ringdrv.c")])
        self.assertTrue(sub.intake(path, ALLOWED, os.path.join(self.d, "x")).ok)

    def test_multi_file_lab(self):
        path = make_zip(os.path.join(self.d, "two.zip"),
                        [("s/a.c", SRC), ("s/b.h", b"#define B 1\n")])
        r = sub.intake(path, ["a.c", "b.h"], os.path.join(self.d, "x"))
        self.assertTrue(r.ok, r.describe())
        self.assertEqual(sorted(r.files()), ["a.c", "b.h"])
        r = sub.intake(path, ["a.c", "c.h"], os.path.join(self.d, "y"))
        self.assertEqual(r.verdict, sub.MISSING)
        self.assertIn("c.h", r.message)
        self.assertEqual(os.listdir(r.scratch), [])

    def test_bare_c_file_with_multi_file_lab_needs_its_name(self):
        p = os.path.join(self.d, "x.c")
        with open(p, "wb") as f:
            f.write(SRC)
        r = sub.intake(p, ["a.c", "b.h"], os.path.join(self.d, "s"))
        self.assertEqual(r.verdict, sub.MISSING)

    def test_hidden_folders_are_not_searched(self):
        path = make_dir(os.path.join(self.d, "repo"), {
            "ringdrv.c": SRC, ".git/objects/ringdrv.c": b"blob"})
        r = sub.intake(path, ALLOWED, os.path.join(self.d, "s"))
        self.assertTrue(r.ok, r.describe())
        self.assertIn(sub.HIDDEN, {i.reason for i in r.ignored})

    def test_device_node_in_a_folder(self):
        path = make_dir(os.path.join(self.d, "dev"), {})
        try:
            os.mknod(os.path.join(path, "ringdrv.c"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            self.skipTest("cannot create device nodes here")
        r = sub.intake(path, ALLOWED, os.path.join(self.d, "s"))
        self.assertEqual(r.verdict, sub.SPECIAL)

    def test_limits_from_lab(self):
        """lab.toml's [limits] is the one source of the intake's caps and the build's."""
        spec = labspec.load_lab("doorbell")
        lim = spec.limits.intake()
        self.assertEqual((lim.max_file_bytes, lim.max_members, lim.max_total_bytes),
                         (spec.limits.max_file_bytes, spec.limits.max_members,
                          spec.limits.max_total_bytes))
        build = labspec.Limits(build_timeout=77).build()
        self.assertEqual((build.timeout, build.cpu_seconds), (77, 77))
        self.assertEqual(dataclasses.replace(build, timeout=120, cpu_seconds=120),
                         sandbox.Limits())
        path = make_dir(os.path.join(self.d, "s"), {"ringdrv.c": SRC})
        r = sub.intake_for_lab(spec, path, os.path.join(self.d, "x"))
        self.assertTrue(r.ok)
        self.assertEqual(r.to_dict()["verdict"], "ok")


class ClassDirTest(unittest.TestCase):
    def test_expand_class(self):
        with tempfile.TemporaryDirectory() as d:
            make_dir(os.path.join(d, "alice"), {"ringdrv.c": SRC})
            make_zip(os.path.join(d, "alice.zip"), [("ringdrv.c", SRC)])
            make_tar(os.path.join(d, "bob.tar.gz"), [reg("ringdrv.c")])
            make_zip(os.path.join(d, "carol.ZIP"), [("ringdrv.c", SRC)])
            with open(os.path.join(d, "dave.c"), "wb") as f:
                f.write(SRC)
            os.symlink("/etc", os.path.join(d, "eve"))
            make_dir(os.path.join(d, ".git"), {})
            with open(os.path.join(d, "roster.csv"), "w") as f:
                f.write("id\n")
            weird = os.path.join(d.encode(), b"fr\xe9d=1")
            os.mkdir(weird)
            scan = roster.scan_class(d)
            ids = {e.student_id: os.path.basename(e.path) for e in scan.entries}
            self.assertEqual(ids["alice"], "alice")
            self.assertEqual(ids["alice.zip"], "alice.zip")
            self.assertEqual(ids["bob"], "bob.tar.gz")
            self.assertEqual(ids["carol"], "carol.ZIP")
            self.assertEqual(ids["dave"], "dave.c")
            self.assertEqual(ids["eve"], "eve")
            self.assertIn("fr_d_1", ids)
            self.assertEqual(len(ids), len(scan.entries))
            self.assertEqual({i.reason for i in scan.skipped}, {sub.HIDDEN, sub.NOT_ALLOWED})
            self.assertEqual(roster.expand_class(d), scan.entries)
            sid, path = scan.entries[0]          # plain (student_id, path) tuples
            self.assertTrue(os.path.exists(path))
            r = sub.intake(os.path.join(d, "eve"), ALLOWED, os.path.join(d, "..", "s-" +
                                                                         os.path.basename(d)))
            self.assertEqual(r.verdict, sub.SYMLINK)
            sub.cleanup(r)

    def test_missing_class_dir(self):
        with self.assertRaises(sub.SubmissionError):
            roster.expand_class("/nonexistent/class")

    def test_one_roster_rule_for_a_class_folder_and_a_single_submission(self):
        """grade.entries_for tells a class folder, and names a submission given
        alone, by the rule scan_class follows (is_student, student_stem)."""
        from mmiolab import grade
        spec = labspec.load_lab("doorbell")
        with tempfile.TemporaryDirectory() as d:
            klass = os.path.join(d, "class")
            os.makedirs(klass)
            make_tar(os.path.join(klass, "alice.tar.xz"), [reg("ringdrv.c")], mode="w:xz")
            open(os.path.join(klass, "notes.txt"), "w").close()
            os.makedirs(os.path.join(klass, ".git"))
            single = os.path.join(d, "BOB.ZIP")
            make_zip(single, [("ringdrv.c", SRC)])
            self.assertEqual([sid for sid, _ in grade.entries_for(spec, [klass, single])],
                             ["alice", "BOB"])
            # Hidden entries make no class: carol/ is one (incomplete) submission.
            carol = os.path.join(d, "carol")
            os.makedirs(os.path.join(carol, ".git"))
            self.assertEqual(grade.entries_for(spec, [carol]), [("carol", carol)])
        with open(grade.__file__) as f:
            self.assertNotIn('".tgz"', f.read(), "grade.py has a suffix list of its own")

    def test_safe_id(self):
        self.assertEqual(roster.safe_id("../../etc"), "_.._etc")
        self.assertEqual(roster.safe_id(".hidden"), "hidden")
        self.assertEqual(roster.safe_id(""), "student")
        self.assertEqual(roster.safe_id("a b/c"), "a_b_c")


class ReadRegularTest(unittest.TestCase):
    def test_a_regular_file_only_never_through_a_link_and_capped(self):
        from mmiolab.lab import _copy_regular
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "f")
            with open(p, "wb") as f:
                f.write(b"12345")
            self.assertEqual(sub.read_regular(p, 5), b"12345")
            self.assertIsNone(sub.read_regular(p, 4))
            os.symlink(p, os.path.join(d, "link"))
            os.mkfifo(os.path.join(d, "fifo"))
            for other in ("link", "fifo", "."):        # (a fifo does not block it)
                with self.subTest(other), self.assertRaises(OSError):
                    sub.read_regular(os.path.join(d, other), 10)
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                self.assertEqual(sub.read_regular("f", 5, dir_fd=fd), b"12345")
            finally:
                os.close(fd)
            # The built module is copied out of the sandbox the same way.
            self.assertTrue(_copy_regular(p, os.path.join(d, "copy")))
            self.assertFalse(_copy_regular(os.path.join(d, "link"), os.path.join(d, "c2")))
            self.assertFalse(_copy_regular(p, os.path.join(d, "c3"), cap=4))
            self.assertEqual(sorted(os.listdir(d)), ["copy", "f", "fifo", "link"])


# ---------------------------------------------------------------------------- labspec

GOOD_TOML = textwrap.dedent("""\
    schema = 1
    name = "demo"
    title = "A demo lab"
    module = "demodrv"
    files = ["demo.c"]
    symbols = ["_printk", "__x86_indirect_thunk_*"]
    default_seeds = [7]
    [limits]
    run_timeout = 30
    [fabric]
    profile = "pc"
    locking = "5.2"
    route_ns = 400
    [phrases]
    lost = "{} commands lost"
    late_irqs = "{} late interrupts"
    [[labstats]]
    variant = "starter"
    fabric = { profile = "qemu" }
    [[labstats]]
    variant = "solution:ref"
    fabric = { locking = "2004", jitter_ns = 0 }
    [[tests]]
    name = "build"
    points = 10
    visibility = "visible"
    source = "host"
    description = "builds"
    [[tests]]
    name = "race"
    points = 30
    visibility = "hidden"
    per_seed = true
    description = "no race"
    credit_by = "flush"
    credit.mmiowb = { share = 1.0 }
    credit.readback = { share = 0.5, why = "a round trip" }
    credit.none = { share = 0, why = "no flush", flag = "read the code" }
    """)


class LabSpecTest(unittest.TestCase):
    def test_doorbell(self):
        spec = labspec.load_lab("doorbell")
        self.assertEqual(spec.files, ("ringdrv.c",))
        self.assertEqual(spec.module, "ringdrv")
        self.assertEqual([t.name for t in spec.tests],
                         ["build", "load_unload", "single_cpu", "race", "cost", "clean_log",
                          "race_4cpu", "race_long", "race_every_run"])
        self.assertEqual([t.points for t in spec.tests], [10, 10, 20, 10, 10, 10, 5, 5, 20])
        self.assertEqual(spec.max_score, 100)
        every = spec.test("race_every_run")
        self.assertEqual((every.source, every.all_of, every.visibility),
                         ("derived", ("race", "race_4cpu", "race_long"), "after_published"))
        self.assertIn("re-checked on other CPU counts", every.notice)
        self.assertEqual([t.name for t in spec.ktap_tests],
                         ["load_unload", "single_cpu", "race", "cost"])
        # hidden/hidden.toml: a second guest, four CPUs, other routes
        self.assertEqual([t.name for t in spec.hidden_tests], ["race_4cpu", "race_long"])
        self.assertEqual(spec.hidden_smp, 4)
        self.assertNotEqual(spec.hidden_fabric["route_ns"], spec.fabric.get("route_ns"))
        self.assertEqual({t.visibility for t in spec.hidden_tests}, {"after_published"})
        for s in ("mmiosim_mmiowb", "mmiosim_read", "mmiosim_write", "__fentry__",
                  "__x86_return_thunk", "__stack_chk_fail", "_printk", "__this_module",
                  "_raw_spin_lock_irqsave", "_raw_spin_unlock_irqrestore", "ioremap",
                  "dma_alloc_attrs", "request_threaded_irq", "misc_register",
                  "__platform_driver_register", "wait_for_completion_timeout", "kfree",
                  "__kmalloc_noprof", "__x86_indirect_thunk_rax"):
            self.assertTrue(spec.symbol_allowed(s), s)
        # what the lab kernel's inline accessors and mmiowb() make every driver import
        for s in ("mmiosim_active", "mmiosim_va_start", "mmiosim_va_size",
                  "mmiosim_mmiowb_state"):
            self.assertTrue(spec.symbol_allowed(s), s)
        # the fabric's own controls would let a driver flush or retune it: forbidden
        controls = ["mmiosim_flush", "mmiosim_set_params", "mmiosim_get_stats",
                    "mmiosim_ring_get_counters", "mmiosim_ioremap"]
        self.assertEqual(spec.forbidden_symbols(["_printk", "filp_open", "kallsyms_lookup_name"]
                                                + controls),
                         sorted(["filp_open", "kallsyms_lookup_name"] + controls))
        self.assertEqual(spec.fabric["profile"], "sn2")
        self.assertGreater(spec.limits.console_cap, 0)
        self.assertTrue(spec.default_seeds)
        self.assertIn("doorbell", labspec.lab_names())

    def test_every_lab_loads(self):
        """posting and modern borrow doorbell's allow-list and add their own."""
        names = labspec.lab_names()
        self.assertEqual(set(names) & {"doorbell", "posting", "modern"},
                         {"doorbell", "posting", "modern"})
        doorbell = labspec.load_lab("doorbell")
        for name in names:
            spec = labspec.load_lab(name)
            self.assertTrue(os.path.isfile(spec.fixture_base_source(CFG)), name)
            self.assertTrue(spec.per_seed_tests, name)
            self.assertEqual(spec.max_score, 100, name)
            if name != "doorbell":
                self.assertLessEqual(doorbell.symbols, spec.symbols, name)
                self.assertIn("mmiosim_flush", spec.forbidden_symbols(["mmiosim_flush"]))
        modern = labspec.load_lab("modern")
        self.assertEqual(modern.fixture_base, "solution:ref")
        self.assertEqual(modern.fixture_base_source(CFG), modern.solution_source("ref", CFG))

    def test_solution_source_is_the_starter_patched_under_build(self):
        """A solution is its patch applied to the starter, in build/ (not in the
        lab's folder), made once per starter and patch; a patch that no longer
        applies, or a missing one, is an error that names it."""
        with tempfile.TemporaryDirectory() as tmp:
            lab, out = os.path.join(tmp, "demo"), os.path.join(tmp, "build")
            os.makedirs(os.path.join(lab, "starter"))
            os.makedirs(os.path.join(lab, "solutions"))
            with open(os.path.join(lab, "lab.toml"), "w") as f:
                f.write(GOOD_TOML)
            starter = os.path.join(lab, "starter", "demo.c")
            with open(starter, "w") as f:
                f.write("int a;\nint b;\nint c;\n")
            patch = os.path.join(lab, "solutions", "fix.patch")
            with open(patch, "w") as f:
                f.write("Solution (fix): b is long.\n\n--- a/demo.c\n+++ b/demo.c\n"
                        "@@ -1,3 +1,3 @@\n int a;\n-int b;\n+long b;\n int c;\n")
            cfg = Config(build=out)
            spec = labspec.load(os.path.join(lab, "lab.toml"))
            self.assertEqual(spec.solutions, ("fix",))
            path = spec.solution_source("fix", cfg)
            self.assertTrue(path.startswith(os.path.join(out, "labs", "demo") + os.sep))
            self.assertEqual(os.path.basename(path), "demo.c")
            with open(path) as f:
                self.assertEqual(f.read(), "int a;\nlong b;\nint c;\n")
            self.assertEqual(spec.solution_source("fix", cfg), path)
            self.assertEqual(sorted(os.listdir(os.path.join(lab, "solutions"))),
                             ["fix.patch"])
            with open(starter, "w") as f:           # the starter changed under it
                f.write("int a;\nint b = 1;\nint c;\n")
            with self.assertRaises(labspec.LabSpecError) as cm:
                spec.solution_source("fix", cfg)
            self.assertIn(f"{patch} does not apply to {starter} without fuzz",
                          str(cm.exception))
            with self.assertRaises(labspec.LabSpecError) as cm:
                spec.solution_source("nope", cfg)
            self.assertIn("no solution 'nope'", str(cm.exception))
            self.assertEqual(os.listdir(os.path.join(out, "labs", "demo", "solutions")),
                             [os.path.basename(os.path.dirname(path))])

    def test_undefined_symbols_from_nm(self):
        nm = "                 U _printk\n                 U filp_open\n0000 T init_module\n" \
             "U __fentry__\n"
        self.assertEqual(labspec.undefined_symbols(nm), ["_printk", "filp_open", "__fentry__"])

    def _load(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(text)
        try:
            return labspec.load(f.name)
        finally:
            os.unlink(f.name)

    def test_good_minimal(self):
        spec = self._load(GOOD_TOML)
        self.assertEqual(spec.limits.run_timeout, 30.0)
        self.assertEqual(spec.limits.build_timeout, 120.0)
        self.assertEqual(spec.fabric["route_ns"], 400)
        self.assertEqual(spec.fabric["locking"], "5.2")
        skip = self._load(GOOD_TOML.replace('locking = "5.2"\n', 'locking = "5.2"\nclock = "skip"\n'))
        self.assertEqual(skip.fabric["clock"], "skip")
        # the phrases keep lab.toml's order; the rows' fabric is boot words
        self.assertEqual(list(spec.phrases), ["lost", "late_irqs"])
        self.assertEqual([(r.variant, r.append) for r in spec.labstats],
                         [("starter", ["mmiosim.profile=qemu"]),
                          ("solution:ref", ["mmiosim.locking=2004", "mmiosim.jitter_ns=0"])])
        self.assertEqual(spec.out(Config(build="/b")), os.path.join("/b", "labs", "demo"))
        self.assertTrue(spec.test("race").per_seed)
        race = spec.test("race")
        self.assertEqual((race.credit_by, [(c.value, c.share) for c in race.credit]),
                         ("flush", [("mmiowb", 1.0), ("readback", 0.5), ("none", 0.0)]))
        self.assertEqual(race.credit_for({"flush": "none", "x": "1"}),
                         labspec.Credit("none", 0.0, "no flush", "read the code"))
        self.assertIsNone(race.credit_for({"flush": "fraction=1"}))
        self.assertIsNone(race.credit_for({}))
        self.assertEqual(spec.test("build").credit, ())
        self.assertEqual(spec.test("race").visibility, "hidden")
        with self.assertRaises(KeyError):
            spec.test("nope")

    def test_bad_specs_say_what_is_wrong(self):
        cases = {
            'points = 30\n': ('points = 30\n', 'point = 30\n', "tests[1].point"),
            "unknown top key": ('schema = 1\n', 'schema = 1\nextra = 1\n', "extra"),
            "bad visibility": ('visibility = "hidden"', 'visibility = "secret"', "visibility"),
            "duplicate test": ('name = "race"', 'name = "build"', "duplicate"),
            "traversal in files": ('files = ["demo.c"]', 'files = ["../demo.c"]', "files[0]"),
            "Makefile in files": ('files = ["demo.c"]', 'files = ["Makefile"]', "Makefile"),
            "negative points": ('points = 30', 'points = -1', "points"),
            "bad seeds": ('default_seeds = [7]', 'default_seeds = []', "default_seeds"),
            "bad profile": ("profile = \"pc\"", 'profile = "alpha"', "fabric.profile"),
            "bad locking": ('locking = "5.2"', 'locking = 5.2', "fabric.locking"),
            "bad clock": ('locking = "5.2"', 'locking = "5.2"\nclock = "fast"',
                          "fabric.clock: must be one of real, skip, got 'fast'"),
            "bad row clock": ('{ profile = "qemu" }', '{ clock = true }', "labstats[0].fabric.clock"),
            "old semantics key": ('locking = "5.2"', 'semantics = "5.2"',
                                  "fabric.semantics: is now called locking"),
            "phrase without {}": ('"{} commands lost"', '"commands lost"', "phrases.lost"),
            "phrase with a field": ('"{} commands lost"', '"{0.__class__} lost"', "phrases.lost"),
            "bad phrase key": ('late_irqs = ', 'late-irqs = ', "phrases.late-irqs"),
            "phrase not a string": ('"{} late interrupts"', '3', "phrases.late_irqs"),
            "bad variant": ('variant = "starter"', 'variant = "solutions/ref"',
                            "labstats[0].variant"),
            "empty row fabric": ('fabric = { profile = "qemu" }', 'fabric = {}',
                                 "labstats[0].fabric: is empty"),
            "bad row locking": ('locking = "2004", jitter_ns', 'locking = "2005", jitter_ns',
                                "labstats[1].fabric.locking"),
            "old key in a row": ('{ profile = "qemu" }', '{ semantics = "2004" }',
                                 "labstats[0].fabric.semantics: is now called locking"),
            "unknown row key": ('variant = "starter"', 'variant = "starter"\nseeds = 3',
                                "labstats[0].seeds"),
            "bad limit": ('run_timeout = 30', 'run_timeout = 0', "limits.run_timeout"),
            "bad source": ('source = "host"', 'source = "guest"', "source"),
            "bad test name": ('name = "race"', 'name = "race # 1"', "tests[1].name"),
            "bad schema": ('schema = 1', 'schema = 2', "schema"),
            "credit without credit_by": ('credit_by = "flush"\n', '',
                                         "tests[1]: credit_by and credit go together"),
            "share above 1": ('share = 1.0', 'share = 2', "tests[1].credit.mmiowb.share"),
            "share negative": ('share = 0,', 'share = -1,', "tests[1].credit.none.share"),
            "credit row key": ('why = "a round trip"', 'words = "a round trip"',
                               "tests[1].credit.readback.words"),
            "credit no share": ('{ share = 1.0 }', '{ why = "x" }',
                                "tests[1].credit.mmiowb.share: missing"),
            "credit on a host test": ('source = "host"\n',
                                      'source = "host"\ncredit_by = "x"\ncredit.a = { share = 1 }\n',
                                      "tests[0].credit_by: the grader decides a host test"),
            "bad credit key": ('credit_by = "flush"', 'credit_by = "flush="',
                               "tests[1].credit_by"),
            "all_of an unknown test": ('description = "builds"\n',
                                       'description = "builds"\n[[tests]]\nname = "every"\n'
                                       'points = 1\nvisibility = "hidden"\n'
                                       'description = "x"\nall_of = ["race", "nope"]\n',
                                       "tests.every.all_of: 'nope' is not another test"),
            "visible all_of of a hidden test": (
                'description = "builds"\n',
                'description = "builds"\n[[tests]]\nname = "every"\npoints = 1\n'
                'visibility = "visible"\ndescription = "x"\nall_of = ["race"]\n',
                "tests.every.visibility: must not be visible: its part 'race' is not"),
            "all_of with a source": ('description = "builds"\n',
                                     'description = "builds"\n[[tests]]\nname = "every"\n'
                                     'points = 1\nvisibility = "hidden"\nsource = "ktap"\n'
                                     'description = "x"\nall_of = ["race"]\n',
                                     "tests[1].all_of: a derived test has no source"),
            "source derived": ('source = "host"', 'source = "derived"', "tests[0].source"),
            "notice without all_of": ('description = "builds"\n',
                                      'description = "builds"\nnotice = "x"\n',
                                      "tests[0].notice: only a derived test"),
            "bad module": ('module = "demodrv"', 'module = "demo-drv"', "module"),
            "missing title": ('title = "A demo lab"\n', '', "title: missing"),
            "bad symbol": ('"_printk"', '"_printk; rm"', "symbols[0]"),
            "unknown symbols_from": ('schema = 1\n', 'schema = 1\nsymbols_from = "nolab"\n',
                                     "symbols_from"),
            "fixture_base outside": ('schema = 1\n', 'schema = 1\nfixture_base = "../x.c"\n',
                                     "fixture_base: must be \"starter\" or \"solution:NAME\""),
            "fixture_base a file": ('schema = 1\n',
                                    'schema = 1\nfixture_base = "solutions/ref/x.c"\n',
                                    'fixture_base: solutions are patches to the starter now: '
                                    'write "solution:ref"'),
        }
        for label, (old, new, needle) in cases.items():
            self.assertIn(old, GOOD_TOML, label)
            with self.subTest(label):
                with self.assertRaises(labspec.LabSpecError) as cm:
                    self._load(GOOD_TOML.replace(old, new, 1))
                self.assertIn(needle, str(cm.exception))
        with self.assertRaises(labspec.LabSpecError) as cm:
            self._load("name = [")
        self.assertIn("not valid TOML", str(cm.exception))

    def test_unknown_lab(self):
        with self.assertRaises(labspec.LabSpecError) as cm:
            labspec.load_lab("nosuchlab")
        self.assertIn("doorbell", str(cm.exception))
        with self.assertRaises(labspec.LabSpecError):
            labspec.load_lab("../etc")


if __name__ == "__main__":
    unittest.main()


class FingerprintTest(unittest.TestCase):
    """--resume's digest of a submission reads only what intake would (issue 24):
    a class folder with an extracted archive of big sparse files costs a listing."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fp-")
        self.addCleanup(__import__("shutil").rmtree, self.tmp)

    def opened(self, path):
        """(digest, names os.open was asked for) of a fingerprint of path."""
        from unittest import mock
        names = []
        real = os.open

        def spy(p, *a, **kw):
            names.append(os.path.basename(os.fsdecode(p)))
            return real(p, *a, **kw)
        with mock.patch.object(sub.os, "open", spy):
            digest = sub.fingerprint(path, ["ringdrv.c"], sub.DEFAULT_LIMITS)
        return digest, names

    def test_a_folder_of_sparse_files_is_listed_not_read(self):
        d = os.path.join(self.tmp, "alice")
        os.makedirs(os.path.join(d, "extracted"))
        with open(os.path.join(d, "ringdrv.c"), "w") as f:
            f.write("int x;\n")
        for i in range(300):
            with open(os.path.join(d, "extracted", f"blob{i}.bin"), "wb") as f:
                f.truncate(64 << 20)
        digest, names = self.opened(d)
        self.assertEqual([n for n in names if n.startswith("blob")], [])
        self.assertEqual(names.count("ringdrv.c"), 1)
        # A blob's content is not read; its size is.
        with open(os.path.join(d, "extracted", "blob7.bin"), "r+b") as f:
            f.write(b"changed")
        self.assertEqual(self.opened(d)[0], digest)
        with open(os.path.join(d, "extracted", "blob7.bin"), "r+b") as f:
            f.truncate(1)
        self.assertNotEqual(self.opened(d)[0], digest)

    def test_the_allowed_file_counts_up_to_the_intake_cap(self):
        d = os.path.join(self.tmp, "bob")
        os.makedirs(d)
        src = os.path.join(d, "ringdrv.c")
        with open(src, "w") as f:
            f.write("int x;\n")
        first = self.opened(d)[0]
        with open(src, "w") as f:
            f.write("int y;\n")
        self.assertNotEqual(self.opened(d)[0], first)
        # Beyond max_file_bytes + 1 intake refuses the file whatever follows.
        cap = sub.DEFAULT_LIMITS.max_file_bytes
        with open(src, "wb") as f:
            f.write(b"a" * (cap + 1) + b"tail one")
        big = self.opened(d)[0]
        with open(src, "wb") as f:
            f.write(b"a" * (cap + 1) + b"tail two")
        self.assertEqual(self.opened(d)[0], big)

    def test_archives_over_the_cap_are_not_read(self):
        p = os.path.join(self.tmp, "carol.zip")
        with open(p, "wb") as f:
            f.write(b"PK\x03\x04")
            f.truncate(sub.DEFAULT_LIMITS.max_archive_bytes + 1)
        digest, names = self.opened(p)
        self.assertEqual(names, [])          # its magic is sniffed (512 bytes), never read
        with open(p, "r+b") as f:
            f.seek(1000)
            f.write(b"changed")
        self.assertEqual(self.opened(p)[0], digest)

    def test_members_past_the_cap_are_not_listed_one_by_one(self):
        d = os.path.join(self.tmp, "dave")
        os.makedirs(d)
        limits = sub.IntakeLimits(max_members=10)
        for i in range(20):
            open(os.path.join(d, f"f{i:02}"), "w").close()
        a = sub.fingerprint(d, ["ringdrv.c"], limits)
        open(os.path.join(d, "f99"), "w").close()          # sorts after the cap
        self.assertEqual(sub.fingerprint(d, ["ringdrv.c"], limits), a)
