"""python3 -m mmiolab: one command over the kit's entry points, the configuration
it builds once and passes down, and the one base of the kit's exceptions it
catches."""

import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from mmiolab import ROOT, MmiolabError
from mmiolab.commands import COMMANDS
from mmiolab import config
from mmiolab.config import Config
from kitcfg import BUILD

PY = "/usr/bin/python3"
ENV = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "scripts")}


def command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "mmiolab", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=120)


class CommandTest(unittest.TestCase):
    def test_lists_its_subcommands(self):
        res = command("--help")
        self.assertEqual(res.returncode, 0)
        for name in ("grade", "labvm", "kernel", "vm", "run", "timeline", "handout",
                     "gradescope", "prairielearn", "labstats", "demo", "merge"):
            self.assertRegex(res.stdout, rf"(?m)^  {name} ")
        res = command()
        self.assertEqual((res.returncode, res.stdout), (2, ""))
        self.assertIn("usage: python3 -m mmiolab SUBCOMMAND", res.stderr)

    def test_an_unknown_subcommand(self):
        res = command("grades")
        self.assertEqual(res.returncode, 2)
        self.assertIn("mmiolab: no subcommand 'grades'", res.stderr)

    def test_each_subcommand_is_its_script(self):
        for args, script in ((["grade", "--help"], ["grade", "--help"]),
                             (["labvm", "--help"], ["kit", "labvm", "--help"]),
                             (["gradescope", "--help"], ["gradescope", "--help"]),
                             (["grade", "--lab", "nope"], ["grade", "--lab", "nope"])):
            with self.subTest(args):
                got = command(*args)
                want = subprocess.run([PY, os.path.join(ROOT, "scripts", script[0]), *script[1:]],
                                      cwd=ROOT, capture_output=True, text=True, timeout=120)
                self.assertEqual((got.returncode, got.stdout, got.stderr),
                                 (want.returncode, want.stdout, want.stderr))

    def test_a_kit_error_no_entry_point_explains_is_one_line(self):
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            book = os.path.join(tmp, "gradebook.csv")
            os.mkdir(book)                              # a folder where the gradebook goes
            res = command("merge", "-o", book, tmp)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertRegex(res.stderr, r"^mmiolab: merge: error: .*unreadable gradebook.*\n$")
        self.assertNotIn("Traceback", res.stderr)

    def test_the_scripts_are_shims_of_it(self):
        """scripts/grade, kit... stay (Makefiles, handouts, the platforms' templates
        and the docs run them); each only calls the command's main."""
        scripts = {prog.split()[0] for _, prog, _ in COMMANDS.values()} - {"python3"}
        self.assertEqual(scripts, {"grade", "kit", "handout", "gradescope", "prairielearn",
                                   "labstats", "demo", "trace-timeline", "coldstart"})
        for name in scripts:
            with open(os.path.join(ROOT, "scripts", name)) as f:
                text = f.read()
            with self.subTest(name):
                self.assertIn("from mmiolab.__main__ import main", text)
                self.assertLess(len(text.splitlines()), 15)

    def test_an_instructors_command_a_handout_leaves_out(self):
        """A handout's kit has no labstats (handout.INSTRUCTOR_TOOLS): the command
        says so in one line."""
        from mmiolab import handout
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            shutil.copytree(os.path.join(ROOT, "scripts", "mmiolab"),
                            os.path.join(tmp, "mmiolab"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            for tool in handout.INSTRUCTOR_TOOLS:
                if tool.startswith("scripts/mmiolab/"):
                    os.unlink(os.path.join(tmp, tool[len("scripts/"):]))
            for name, want in (("labstats", 2), ("demo", 2), ("handout", 2), ("grade", 0)):
                res = subprocess.run([PY, "-m", "mmiolab", name, "--help"], cwd=tmp,
                                     env={**ENV, "PYTHONPATH": tmp}, capture_output=True,
                                     text=True, timeout=60)
                with self.subTest(name):
                    self.assertEqual(res.returncode, want, res.stderr)
                    if want:
                        self.assertEqual(res.stderr, f"mmiolab: {name}: not in this kit (a "
                                         "student handout or an autograder carries no "
                                         "instructor's tools)\n")

    def test_the_makefiles_call_it(self):
        res = subprocess.run(["make", "-n", "-C", os.path.join(ROOT, "labs", "doorbell"),
                              "timeline"], capture_output=True, text=True, timeout=60)
        self.assertIn("-m mmiolab timeline --lab doorbell", res.stdout)


class ConfigTest(unittest.TestCase):
    def test_the_environment_variables_keep_their_names_and_meanings(self):
        self.assertEqual(Config.from_env({}), Config())
        self.assertEqual(Config().build, os.path.join(ROOT, "build"))
        env = {"MMIOLAB_BUILD": "/b", "MMIOLAB_KERNEL_TARBALL": "/t.tar.xz",
               "MMIOLAB_PATCHES": "/p", "MMIOLAB_DEBUG": "1", "MMIOLAB_SMP": "4",
               "MMIOLAB_MEM": "1G", "MMIOLAB_ACCEL": "tcg", "MMIOLAB_SANDBOX_UID": "1000",
               "MMIOLAB_SANDBOX_GID": "1001", "MMIOLAB_QEMU_MONITOR": "/m.sock",
               "MMIOLAB_AUTOGRADER": "/ag", "MMIOLAB_PRAIRIELEARN": "/pl",
               "MMIOLAB_CONFINE": "jail", "MMIOLAB_JAIL_UID": "70000",
               "MMIOLAB_JAIL_GID": "70001", "MMIOLAB_TIME_LIMIT": "1200", "PATH": "/bin"}
        self.assertEqual(set(config.ENV.values()), set(env) - {"PATH"})
        self.assertEqual(Config.from_env(env), Config(
            build="/b", kernel_tarball="/t.tar.xz", patches="/p", debug=True, smp=4,
            memory="1G", accel="tcg", sandbox_uid=1000, sandbox_gid=1001,
            qemu_monitor="/m.sock", autograder="/ag", prairielearn="/pl", confine="jail",
            jail_uid=70000, jail_gid=70001, time_limit=1200))
        self.assertFalse(Config.from_env({"MMIOLAB_DEBUG": "yes"}).debug)   # only "1"
        # Arguments override the environment; one not given (None) does not.
        cfg = Config.from_env(env, smp=2, accel=None)
        self.assertEqual((cfg.smp, cfg.accel), (2, "tcg"))

    def test_a_malformed_number_is_a_one_line_error(self):
        with self.assertRaisesRegex(config.ConfigError, r"MMIOLAB_SMP='two': not an integer"):
            Config.from_env({"MMIOLAB_SMP": "two"})
        with self.assertRaisesRegex(config.ConfigError, r"MMIOLAB_CONFINE='chroot': not one of "
                                                        r"bubblewrap, jail"):
            Config.from_env({"MMIOLAB_CONFINE": "chroot"})
        env = {**os.environ, "MMIOLAB_SANDBOX_UID": "x", "PYTHONPATH": os.path.join(ROOT, "scripts")}
        res = subprocess.run([sys.executable, "-m", "mmiolab", "run", "--", "true"], env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertEqual((res.returncode, res.stderr),
                         (2, "mmiolab: run: error: MMIOLAB_SANDBOX_UID='x': not an integer\n"))

    def test_what_is_built_from_it(self):
        from mmiolab import kernel, vm
        cfg = Config(build="/b", smp=3, memory="1G", accel="tcg", qemu_monitor="/m")
        t = kernel.tree(cfg)
        if not t.prebuilt:
            self.assertEqual((t.kdir, t.debug), ("/b/kernel", False))
        self.assertEqual(kernel.tree(cfg, debug=True).kdir, "/b/kernel-debug")
        self.assertTrue(kernel.tree(Config(build="/b", debug=True)).debug)
        opts = vm.VMConfig.from_config(cfg, timeout=5)
        self.assertEqual((opts.smp, opts.memory, opts.accel, opts.build, opts.monitor,
                          opts.kernel, opts.timeout),
                         (3, "1G", "tcg", "/b", "/m", t.bzimage, 5))
        self.assertEqual(vm.VMConfig.from_config(cfg, smp=1, accel="kvm").smp, 1)

    def test_no_module_reads_the_environment_when_imported(self):
        """Configuration comes from the Config a command builds (or, for a library
        call given none, from the environment at the call): importing any module
        of the kit reads no MMIOLAB_* variable."""
        code = (
            "import importlib, os, sys\n"
            "sys.path.insert(0, %r)\n"
            "read = set()\n"
            "class Spy(dict):\n"
            "    def __getitem__(self, k): read.add(k); return super().__getitem__(k)\n"
            "    def get(self, k, d=None): read.add(k); return super().get(k, d)\n"
            "    def __contains__(self, k): read.add(k); return super().__contains__(k)\n"
            "os.environ = Spy(os.environ)\n"
            "top = os.path.join(sys.path[0], 'mmiolab')\n"
            "names = ['mmiolab.__main__']\n"
            "for sub in ('', 'commands'):\n"
            "    pkg = '.'.join(['mmiolab'] + ([sub] if sub else []))\n"
            "    names += [pkg + '.' + n[:-3] for n in sorted(os.listdir(os.path.join(top, sub)))\n"
            "              if n.endswith('.py') and n != '__main__.py']\n"
            "for n in names: importlib.import_module(n)\n"
            "print(len(names), sorted(k for k in read if k.startswith('MMIOLAB')))\n"
        ) % os.path.join(ROOT, "scripts")
        res = subprocess.run([PY, "-c", code], env={**ENV, "MMIOLAB_SMP": "3"},
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        count, read = res.stdout.split(" ", 1)
        self.assertGreater(int(count), 40)
        self.assertEqual(read.strip(), "[]")


class ErrorsTest(unittest.TestCase):
    def test_every_error_of_the_kit_is_a_mmiolab_error(self):
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import importlib
        folder = os.path.join(ROOT, "scripts", "mmiolab")
        found = []
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".py") or name.startswith("__"):
                continue
            mod = importlib.import_module(f"mmiolab.{name[:-3]}")
            for cname, cls in inspect.getmembers(mod, inspect.isclass):
                if cls.__module__ == mod.__name__ and issubclass(cls, BaseException) \
                        and not cname.startswith("_"):
                    found.append(cname)
                    if issubclass(cls, KeyboardInterrupt):
                        continue    # an interrupt (vm.Stopped): no "except Exception" catches it
                    self.assertTrue(issubclass(cls, MmiolabError), f"{name}: {cname}")
        self.assertGreaterEqual(len(found), 17)


if __name__ == "__main__":
    unittest.main()
