"""The grading platforms as one wing (scripts/mmiolab/platforms/): each platform
has the same few names, the pipeline names none of them, --platform NAME and
the old flags are one option, and a platform added to the registry is graded
into with no change to the pipeline."""

import argparse
import ast
import dataclasses
import json
import os
import tempfile
import unittest
from unittest import mock

from mmiolab import ROOT, grade, labspec, model, stages
from mmiolab.commands import grade as grade_command
from mmiolab.config import Config
from mmiolab.platforms import PLATFORMS, Container, Platform, platform
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
                             pack_module="mmiolab.platforms.gradescope.pack",
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


if __name__ == "__main__":
    unittest.main()
