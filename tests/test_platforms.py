"""The grading platforms as one wing (scripts/mmiolab/platforms/): each platform
has the same few names, the pipeline names none of them, --platform NAME and
the old flags are one option, each platform's runner lays out its image and
jobs and reads back what its own writer wrote, and a platform added as one
folder and one registry line is graded into, packed, calibrated against,
run in containers and checked in a clean root with no other file edited."""

import argparse
import ast
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

from mmiolab import ROOT, grade, labspec, model, stages
from mmiolab.commands import grade as grade_command
from mmiolab.config import Config
from mmiolab.commands import COMMANDS
from mmiolab.platforms import PLATFORMS, Container, Platform, platform
from mmiolab.platforms.base import RootCheck
from kitcfg import BUILD

PIPELINE = ("stages.py", "grade.py", "report.py", "gradebook.py", "model.py")


def result(score=10.0):
    return model.GradeResult(
        submission_id="submission", lab="doorbell", submission="ringdrv.c",
        tests=[model.TestOutcome("build", score, 10, "passed" if score else "failed",
                                 "built", "visible", "the build")])


class RegistryTest(unittest.TestCase):
    def test_every_platform_has_the_same_names(self):
        self.assertEqual(sorted(PLATFORMS), ["gradescope", "prairielearn"])
        cfg = Config()
        for name, p in PLATFORMS.items():
            with self.subTest(name):
                self.assertIsInstance(p, Platform)
                self.assertEqual(p.name, name)
                self.assertTrue(p.submission(cfg).startswith(p.root(cfg) + os.sep))
                self.assertTrue(p.results_path(cfg).startswith(p.root(cfg) + os.sep))
                packer = p.packer()
                self.assertTrue(callable(packer.pack) and callable(packer.default_out))
                self.assertEqual(packer.default_out(cfg), os.path.join(cfg.build, name))
                runner = p.runner()
                for each in ("image", "job", "read"):
                    self.assertTrue(callable(getattr(runner, each)), each)
                self.assertIsInstance(runner.ROOT_CHECK, RootCheck)
                self.assertIsInstance(runner.CHECKER_BEFORE_PLATFORMS, str)
                self.assertEqual(COMMANDS[name][0], p.command)
                command = importlib.import_module(p.command)
                self.assertTrue(callable(command.add_arguments) and callable(command.run))

    def test_the_containers_paths_move_with_the_configuration(self):
        cfg = Config(autograder="/ag", prairielearn="/pl")
        self.assertEqual(PLATFORMS["gradescope"].submission(cfg), "/ag/submission")
        self.assertEqual(PLATFORMS["gradescope"].results_path(cfg), "/ag/results/results.json")
        self.assertEqual(PLATFORMS["prairielearn"].submission(cfg), "/pl/student")
        self.assertEqual(PLATFORMS["prairielearn"].results_path(cfg),
                         "/pl/results/results.json")

    def test_an_unknown_platform_names_the_known_ones(self):
        with self.assertRaisesRegex(KeyError, "gradescope, prairielearn"):
            platform("codegrade")

    def test_each_writer_makes_what_its_checker_takes(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name, p in PLATFORMS.items():
                with self.subTest(name):
                    path = os.path.join(tmp, name, "results", "results.json")
                    p.write_results(result(), path)
                    with open(path) as f:
                        self.assertEqual(p.problems(json.load(f)), [])
                    self.assertNotEqual(p.problems({"score": "ten"}), [])

    def test_the_pipeline_names_no_platform(self):
        """Nothing below the grade command lists the platforms: adding one is a
        folder and a registry line (platforms/__init__.py)."""
        for module in PIPELINE:
            with open(os.path.join(ROOT, "scripts", "mmiolab", module)) as f:
                tree = ast.parse(f.read())
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
                      for a in n.args + n.kwonlyargs}
            names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                      for a in n.names}
            with self.subTest(module):
                self.assertFalse({"gradescope", "prairielearn"} & {x.lower() for x in names},
                                 f"{module} names a platform")

    def test_the_commands_and_runners_pick_no_platform_by_name(self):
        """The commands that take platforms, scripts/containers and
        scripts/cleanroot go over the registry: no branch on a platform's
        name, no PLATFORMS["gradescope"] (words in docstrings aside)."""
        for path in ("scripts/containers", "scripts/cleanroot", "scripts/mmiolab/__main__.py",
                     "scripts/mmiolab/commands/__init__.py", "scripts/mmiolab/commands/grade.py",
                     "scripts/mmiolab/commands/calibrate.py"):
            with open(os.path.join(ROOT, path)) as f:
                tree = ast.parse(f.read())
            said = {n.value.lower() for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            said |= {n.id.lower() for n in ast.walk(tree) if isinstance(n, ast.Name)}
            said |= {n.attr.lower() for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            with self.subTest(path):
                self.assertFalse(set(PLATFORMS) & said, f"{path} picks a platform by name")


class OptionTest(unittest.TestCase):
    def parse(self, *argv):
        import argparse
        ap = argparse.ArgumentParser()
        grade_command.add_arguments(ap)
        return ap.parse_args(["--lab", "doorbell", *argv])

    def test_the_old_flags_are_the_platform_option(self):
        for name in PLATFORMS:
            with self.subTest(name):
                self.assertEqual(self.parse(f"--{name}").platform, name)
                self.assertEqual(self.parse("--platform", name).platform, name)
        self.assertIsNone(self.parse("a.c").platform)

    def test_one_platform_at_a_time(self):
        with mock.patch("sys.stderr"), self.assertRaises(SystemExit):
            self.parse("--gradescope", "--platform", "prairielearn")


class NewPlatformTest(unittest.TestCase):
    """A third platform, registered as a folder would register it, is graded
    into by grade_one with no change to the pipeline."""

    def test_a_registered_platform_gets_its_results_file(self):
        written = []

        def write_results(res, path):
            written.append(path)
            model.atomic_write(path, json.dumps({"points": res.score}))
            return True

        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            cfg = Config(build=BUILD, autograder=os.path.join(tmp, "codegrade"))
            other = Platform(name="codegrade", title="CodeGrade", root_setting="autograder",
                             student="student", results="out/grade.json",
                             write_results=write_results, problems=lambda doc: [],
                             package="mmiolab.platforms.gradescope", packs="a zip",
                             container=Container(cpus=1, memory="1g", timeout=60))
            spec = labspec.load_lab("doorbell")
            opts = grade.GradeOptions(seeds=[1], out=os.path.join(tmp, "out"), cfg=cfg)
            refused = stages.Refused(verdict="intake", why="no ringdrv.c")
            with mock.patch.object(stages, "prepare", lambda *a, **k: refused):
                r = grade.grade_one(spec, other.submission(cfg), "submission", opts,
                                    platform=other)
            self.assertEqual(written, [os.path.join(tmp, "codegrade", "out", "grade.json")])
            with open(written[0]) as f:
                self.assertEqual(json.load(f), {"points": r.score})

    def test_a_job_keeps_to_the_platforms_time_limit_or_the_one_set(self):
        for p in PLATFORMS.values():
            with self.subTest(p.name):
                self.assertEqual(p.budget(Config()), 600)
                self.assertEqual(p.budget(Config(time_limit=1200)), 1200)

    def test_the_grade_command_grades_to_the_platforms_deadline(self):
        seen = []

        def fake_grade_one(spec, path, sub_id, opts, platform=None):
            seen.append(opts.deadline)
            return stages.not_graded(spec, sub_id, "intake", "no ringdrv.c")

        with tempfile.TemporaryDirectory(dir=BUILD) as tmp, \
                mock.patch.object(grade_command, "grade_one", fake_grade_one), \
                mock.patch.object(grade_command, "confinement", lambda cfg: ("jail", "")), \
                mock.patch.object(grade_command.initramfs, "build", lambda cfg: None), \
                mock.patch.object(grade_command.os.path, "exists", lambda p: True):
            cfg = Config(build=tmp, autograder=tmp, time_limit=900)
            ap = argparse.ArgumentParser()
            grade_command.add_arguments(ap)
            grade_command.run(ap.parse_args(["--lab", "doorbell", "--gradescope"]), cfg)
        self.assertEqual(seen, [grade_command.STARTED + 900 - grade_command.JOB_RESERVE])

    def test_container_limits_are_dockers_flags(self):
        """The runner's docker options come from the registry: Gradescope's
        defaults (half a CPU, 768 MB; its image built under them) and
        PrairieLearn's grader-host's (0.9 CPU, 2 GiB without swap, 1024
        processes; an image built without limits)."""
        gs, pl = PLATFORMS["gradescope"].container, PLATFORMS["prairielearn"].container
        self.assertEqual(gs.run_flags(), ("--cpus=0.5", "--memory=768m"))
        self.assertEqual(gs.build_flags(), ("--cpu-period=100000", "--cpu-quota=50000",
                                            "--memory=768m"))
        self.assertEqual(pl.run_flags(), ("--cpus=0.9", "--memory=2g", "--memory-swap=2g",
                                          "--pids-limit=1024"))
        self.assertEqual(pl.build_flags(), ())
        self.assertEqual((gs.timeout, pl.timeout), (600, 600))

    def test_the_platform_is_frozen(self):
        with self.assertRaises(dataclasses.FrozenInstanceError):
            PLATFORMS["gradescope"].results = "elsewhere"  # type: ignore[misc]


class RunnerTest(unittest.TestCase):
    """Each platform's runner.py (what scripts/containers builds and runs in
    Docker) lays out its image and jobs at the platform's own paths and reads
    back what the platform's writer wrote; no Docker needed for these."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(dir=BUILD)
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.source = os.path.join(self.tmp, "alice.c")
        with open(self.source, "w") as f:
            f.write("/* alice */\n")

    def test_gradescope_builds_from_the_zip_and_runs_run_autograder(self):
        runner = PLATFORMS["gradescope"].runner()
        packed = os.path.join(self.tmp, "packed")
        os.makedirs(packed)
        with open(os.path.join(packed, "mmiolab-doorbell-autograder.zip"), "wb") as f:
            f.write(b"PK zip")
        recipe = runner.image("doorbell", "mmiolab-base:trixie", packed,
                              os.path.join(self.tmp, "ctx"))
        with open(recipe.dockerfile) as f:
            text = f.read()
        self.assertTrue(text.splitlines()[3:4] == ["FROM mmiolab-base:trixie"], text)
        self.assertIn("cd /autograder/source && unzip -q /tmp/autograder.zip", text)
        self.assertIn("bash ./setup.sh", text)
        with open(os.path.join(recipe.context, "autograder.zip"), "rb") as f:
            self.assertEqual(f.read(), b"PK zip")
        folder = os.path.join(self.tmp, "job")
        job = runner.job(recipe, folder, self.source, "ringdrv.c")
        self.assertEqual(job.options, ("-v", f"{folder}/submission:/autograder/submission",
                                       "-v", f"{folder}/results:/autograder/results"))
        self.assertEqual(job.command, ("/autograder/run_autograder",))
        self.assertEqual(job.results, os.path.join(folder, "results", "results.json"))
        with open(os.path.join(folder, "submission", "ringdrv.c")) as f:
            self.assertEqual(f.read(), "/* alice */\n")

    def test_prairielearn_builds_the_kits_dockerfile_and_runs_its_entrypoint(self):
        runner = PLATFORMS["prairielearn"].runner()
        packed = os.path.join(self.tmp, "packed")
        image_dir = os.path.join(packed, "doorbell", "grader-image")
        question = os.path.join(packed, "doorbell", "question")
        os.makedirs(image_dir)
        os.makedirs(os.path.join(question, "tests", "hidden"))
        with open(os.path.join(image_dir, "Dockerfile"), "w") as f:
            f.write("# the kit's\nFROM ubuntu:24.04\nRUN true\n")
        with open(os.path.join(question, "tests", "hidden", "prog.c"), "w") as f:
            f.write("int main(void) { return 0; }\n")
        with open(os.path.join(question, "info.json"), "w") as f:
            json.dump({"externalGradingOptions": {"entrypoint": "/usr/local/bin/grade-it"}}, f)
        recipe = runner.image("doorbell", "mmiolab-base:trixie", packed,
                              os.path.join(self.tmp, "work"))
        self.assertEqual(recipe.context, image_dir)
        with open(recipe.dockerfile) as f:
            self.assertEqual(f.read(), "# the kit's\nFROM mmiolab-base:trixie\nRUN true\n")
        self.assertIn("FROM ubuntu:24.04 replaced by FROM mmiolab-base:trixie", recipe.note)
        folder = os.path.join(self.tmp, "job")
        job = runner.job(recipe, folder, self.source, "ringdrv.c")
        grade_dir = os.path.join(folder, "grade")
        self.assertEqual(job.options, ("-v", f"{grade_dir}:/grade",
                                       "--entrypoint", "/usr/local/bin/grade-it"))
        self.assertEqual(job.command, ())
        self.assertEqual(job.results, os.path.join(grade_dir, "results", "results.json"))
        self.assertTrue(os.path.isfile(os.path.join(grade_dir, "student", "ringdrv.c")))
        self.assertTrue(os.path.isfile(os.path.join(grade_dir, "tests", "hidden", "prog.c")))
        with open(os.path.join(grade_dir, "data", "data.json")) as f:
            self.assertEqual(json.load(f)["submitted_answers"]["_files"], [{"name": "ringdrv.c"}])
        with open(os.path.join(image_dir, "Dockerfile"), "w") as f:
            f.write("RUN true\n")
        with self.assertRaisesRegex(ValueError, "no FROM line"):
            runner.image("doorbell", "b", packed, os.path.join(self.tmp, "work"))

    def test_each_runner_reads_what_its_writer_wrote(self):
        res = model.GradeResult(
            submission_id="submission", lab="doorbell", submission="ringdrv.c", tests=[
                model.TestOutcome("build", 10, 10, "passed", "built", "visible", "the build"),
                model.TestOutcome("race", 0, 5, "failed", "lost", "visible", "the race")])
        for name, p in PLATFORMS.items():
            with self.subTest(name):
                path = os.path.join(self.tmp, name, "results.json")
                self.assertTrue(p.write_results(res, path))
                with open(path) as f:
                    reading = p.runner().read(json.load(f))
                self.assertEqual((reading.score, reading.max_score, reading.failed,
                                  reading.problem, reading.graded), (10, 15, ["race"], "", True))
                self.assertIsNotNone(p.runner().read([]).problem)

    def test_prairielearn_not_gradable_is_no_grade(self):
        read = PLATFORMS["prairielearn"].runner().read
        reading = read({"gradable": False, "message": "the grader failed"})
        self.assertEqual((reading.score, reading.graded), (None, False))
        self.assertEqual(reading.problem, "not gradable: the grader failed")
        self.assertIn("INVALID", read({"score": 1.5, "tests": []}).problem)


# A fourth grading platform, written as a folder would be (its name is not in
# the kit): its contract and writer, a packer, its pack subcommand and a runner.
NEW_PLATFORM = {
    "__init__.py": """
        import os
        from mmiolab.platforms.base import Container, Platform
        from mmiolab.report import write_results_json

        def write_results(result, path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_results_json(result, path)
            return True

        PLATFORM = Platform(
            name="newplat", title="NewPlat", student="in",
            # Its container's root: beside this folder (no Config field of its own).
            root_setting="", root_default=os.path.join(os.path.dirname(__file__), "..", "root"),
            results="out/result.json", write_results=write_results,
            problems=lambda doc: [] if isinstance(doc, dict) else ["not an object"],
            package=__name__, packs="a lab's NewPlat bundle",
            container=Container(cpus=1, memory="1g", timeout=300))
    """,
    "pack.py": """
        import os

        def pack(spec, out_dir, allow_unconfined=False, *, cfg):
            os.makedirs(out_dir, exist_ok=True)
            path = os.path.join(out_dir, f"newplat-{spec.name}.txt")
            with open(path, "w") as f:
                f.write(spec.name + "\\n")
            return path

        def default_out(cfg):
            return os.path.join(cfg.build, "newplat")
    """,
    "command.py": """
        \"\"\"Pack a lab's NewPlat bundle.\"\"\"
        from mmiolab import labspec
        from mmiolab.commands import add_pack_arguments, pack_each
        from . import pack as packer

        def add_arguments(ap):
            add_pack_arguments(ap, "bundles", "build/newplat", "NewPlat")

        def run(args, cfg):
            out = args.out or packer.default_out(cfg)
            return pack_each("newplat", args.lab or labspec.lab_names(),
                             lambda name: packer.pack(labspec.load_lab(name), out, cfg=cfg),
                             lambda path: path)
    """,
    "runner.py": """
        \"\"\"NewPlat: the bundle copied into /np, a job runs /np/go.\"\"\"
        import os, shutil
        from mmiolab.platforms.base import ImageRecipe, JobSpec, Reading, RootCheck

        def image(lab, base, packed, work):
            os.makedirs(work, exist_ok=True)
            with open(os.path.join(work, "Dockerfile"), "w") as f:
                f.write(f"FROM {base}\\nCOPY . /np\\n")
            return ImageRecipe(context=work, dockerfile=os.path.join(work, "Dockerfile"),
                               packed=packed)

        def job(recipe, folder, source, file):
            os.makedirs(os.path.join(folder, "in"))
            shutil.copyfile(source, os.path.join(folder, "in", file))
            return JobSpec(options=("-v", f"{folder}:/np/job"), command=("/np/go",),
                           results=os.path.join(folder, "out", "result.json"))

        def read(doc):
            return Reading(doc["score"], doc["extra_data"]["mmiolab"]["max_score"],
                           [t["name"] for t in doc["tests"] if t["status"] != "passed"])

        CHECKER_BEFORE_PLATFORMS = ""
        ROOT_CHECK = RootCheck(prereqs=("make",), job="cat /mnt/art/newplat-@LAB@.txt @FILE@\\n")
    """,
}

# Run with the folder on sys.path: the registry line, then every entry point
# that takes platforms, each asked what it makes of the new one.
DRIVE = """
import contextlib, io, json, os, sys, types
from unittest import mock
tmp, scripts = sys.argv[1:]
sys.path[:0] = [tmp, scripts]
from mmiolab import platforms
import newplat
platforms.PLATFORMS[newplat.PLATFORM.name] = newplat.PLATFORM   # the registry line

from mmiolab import model, speed, stages
from mmiolab.__main__ import main
from mmiolab.commands import grade as grade_command
from mmiolab.platforms.base import ImageRecipe

def load(name):
    import importlib.machinery, importlib.util
    loader = importlib.machinery.SourceFileLoader(name, os.path.join(scripts, name))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # its dataclasses look themselves up there
    loader.exec_module(module)
    return module

def said(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = main(list(argv))
        except SystemExit as e:
            status = e.code
    return status, out.getvalue()

seen = {}
seen["usage"] = said("help")[1]
status, _ = said("newplat", "--lab", "doorbell", "--out", os.path.join(tmp, "packs"))
seen["pack"] = [status, os.listdir(os.path.join(tmp, "packs"))]
seen["grade help"] = said("grade", "--help")[1]

graded = []
def fake_grade_one(spec, path, sub_id, opts, platform=None):
    graded.append([path, platform.name, opts.deadline - grade_command.STARTED])
    return stages.not_graded(spec, sub_id, "intake", "no ringdrv.c")
with mock.patch.object(grade_command, "grade_one", fake_grade_one), \
        mock.patch.object(grade_command, "confinement", lambda cfg: ("jail", "")), \
        mock.patch.object(grade_command.initramfs, "build", lambda cfg: None), \
        mock.patch.object(grade_command.os.path, "exists", lambda p: True):
    seen["grade status"] = said("grade", "--lab", "doorbell", "--newplat")[0]
seen["graded"] = graded

cal = speed.Calibration(work_seconds=1, boot_seconds=1, smp=2, factor=1, share=1,
                        when="now", got_cpus=0.001)
with mock.patch.object(speed, "calibrate", lambda cfg: cal):
    seen["calibrate"] = said("calibrate", "--lab", "doorbell", "--platform", "newplat")

containers = load("containers")
with mock.patch.object(sys, "argv", ["containers", "--help"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            containers.main()
        except SystemExit:
            pass
seen["containers help"] = out.getvalue()
source = os.path.join(tmp, "alice.c")
with open(source, "w") as f:
    f.write("/* alice */\\n")
recipe = newplat.PLATFORM.runner().image("doorbell", "base", tmp, os.path.join(tmp, "ctx"))
job = containers.Job("doorbell", "newplat", "trixie", "starter", source, "ringdrv.c",
                     "image", recipe)
spec = newplat.PLATFORM.runner().job(recipe, os.path.join(tmp, "job"), source, "ringdrv.c")
result = model.GradeResult(submission_id="submission", lab="doorbell", submission="ringdrv.c",
    tests=[model.TestOutcome("build", 10, 10, "passed", "", "visible", ""),
           model.TestOutcome("race", 0, 5, "failed", "lost", "visible", "")])
newplat.PLATFORM.write_results(result, spec.results)      # as the job would
out = containers.Outcome(job)
containers.read_results(out, spec.results)
seen["containers read"] = [out.score, out.max_score, out.failed, out.problem, out.expected]

cleanroot = load("cleanroot")
art = os.path.join(tmp, "art")
os.makedirs(art)
from mmiolab.config import Config
seen["cleanroot checks"] = sorted(cleanroot.checks())
seen["cleanroot job"] = cleanroot.stage("newplat", "doorbell", art, Config.from_env())
seen["cleanroot art"] = sorted(os.listdir(art))
print(json.dumps(seen))
"""


class FolderPlatformTest(unittest.TestCase):
    """A platform added as one folder (written here, outside the kit) and one
    registry line is taken by every command that takes platforms, none of
    them edited: python3 -m mmiolab's usage and its pack subcommand, grade
    --platform NAME and --NAME (into the platform's folders, to its time
    limit), calibrate --platform NAME (its limit, no second copy),
    scripts/containers (its limits, its runner's words, its results read back)
    and scripts/cleanroot --check NAME."""

    def test_one_folder_and_one_registry_line(self):
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            folder = os.path.join(tmp, "newplat")
            os.makedirs(folder)
            for name, text in NEW_PLATFORM.items():
                with open(os.path.join(folder, name), "w") as f:
                    f.write(textwrap.dedent(text).lstrip())
            env = {**os.environ, "MMIOLAB_BUILD": BUILD}
            res = subprocess.run([sys.executable, "-c", DRIVE, tmp,
                                  os.path.join(ROOT, "scripts")], capture_output=True,
                                 text=True, env=env, timeout=600)
            self.assertEqual(res.returncode, 0, res.stderr[-4000:])
            seen = json.loads(res.stdout.splitlines()[-1])
        self.assertIn("newplat", seen["usage"])
        self.assertIn("a lab's NewPlat bundle", seen["usage"])
        self.assertEqual(seen["pack"], [0, ["newplat-doorbell.txt"]])
        self.assertIn("--newplat", seen["grade help"])
        self.assertEqual(seen["grade status"], 0)
        self.assertEqual(seen["graded"], [[os.path.join(folder, "..", "root", "in"), "newplat",
                                           300 - grade_command.JOB_RESERVE]])
        status, text = seen["calibrate"]
        self.assertEqual(status, 1, text)
        self.assertIn("NewPlat's limit of 300s cannot fit a doorbell submission", text)
        self.assertIn("newplat (--cpus=1 --memory=1g, 300 s a job): NewPlat: the bundle",
                      seen["containers help"])
        self.assertEqual(seen["containers read"], [10, 15, ["race"], "", True])
        self.assertEqual(seen["cleanroot checks"],
                         ["gradescope", "handout", "newplat", "prairielearn"])
        self.assertEqual(seen["cleanroot job"], "cat /mnt/art/newplat-doorbell.txt ringdrv.c\n")
        self.assertEqual(seen["cleanroot art"], ["newplat-doorbell.txt", "solution.c",
                                                 "starter.c"])


if __name__ == "__main__":
    unittest.main()
