"""Grading in a real container, as Gradescope grades (scripts/containers): the
doorbell lab's autograder zip unzipped and its setup.sh run while a Debian 13
image builds, then run_autograder for each submission under Docker's default
seccomp profile (no new user namespaces), with half a CPU and 768 MB, no
extra capabilities. The starter must lose points and say why, the reference
solution must get every point, both in a valid results.json that names the
confinement that ran.

Skipped, with the reason, where containers cannot run here (not root, no
docker.io, a daemon that does not start: scripts/containers --probe); .ci/run
installs and starts what it needs. The first run makes a debootstrap root and
the image (minutes; kept in $MMIOLAB_ROOTS or /var/tmp/mmiolab-roots, and
the image in Docker, while the zip is unchanged); later runs reuse them.
"""

import json
import os
import subprocess
import tempfile
import unittest

from mmiolab import ROOT
from mmiolab.labspec import load_lab
from kitcfg import BUILD
from vmtest import need_guest, report

PY = "/usr/bin/python3"
SCRIPT = os.path.join(ROOT, "scripts", "containers")
# A guard against a wedged daemon, not a measure: a first run (root, image, two
# gradings at half a CPU) takes minutes.
WALL = 3600


class GradescopeContainerTest(unittest.TestCase):
    def test_doorbell_starter_fails_solution_gets_full_marks(self):
        need_guest(self)
        probe = subprocess.run([PY, SCRIPT, "--probe"], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=300)
        if probe.returncode == 3:
            self.skipTest(probe.stdout.strip().removeprefix("mmiolab: "))
        self.assertEqual(probe.returncode, 0, probe.stdout + probe.stderr)
        solution = f"solution:{load_lab('doorbell').solutions[0]}"
        with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
            out = os.path.join(tmp, "outcomes.json")
            res = subprocess.run([PY, SCRIPT, "--lab", "doorbell", "--platform", "gradescope",
                                  "--release", "trixie", "--submission", "starter",
                                  "--submission", solution, "--results", out],
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                 timeout=WALL)
            for line in res.stdout.splitlines():
                if line.startswith("mmiolab: containers: ") and (
                        " built in " in line or "reused" in line or "#1:" in line
                        or "setup.sh done" in line):
                    report(line.removeprefix("mmiolab: containers: "))
            self.assertTrue(os.path.isfile(out), res.stdout[-4000:] + res.stderr)
            with open(out) as f:
                runs = {o["submission"]: o for o in json.load(f)}
        starter, sol = runs["starter"], runs[solution]
        for o in (starter, sol):
            # A results.json Gradescope accepts: not a refusal, not invalid.
            self.assertEqual(o["problem"], "", f"{o['submission']}: {o['verdict']}\n"
                             f"(log {o['log']})")
            self.assertNotIn(o["confinement"], ("not said", "unconfined",
                                                "none (unconfined build)"),
                             f"{o['submission']}: the result must name the confinement")
        self.assertTrue(starter["failed"], "the starter failed no test")
        self.assertLess(starter["score"], starter["max_score"], starter["verdict"])
        with open(starter["results"]) as f:
            why = [t.get("output", "").strip() for t in json.load(f)["tests"]
                   if t["name"] in starter["failed"]]
        self.assertTrue(all(why), "each failed test must say why")
        self.assertEqual(sol["failed"], [], f"{sol['verdict']} (log {sol['log']})")
        self.assertEqual(sol["score"], sol["max_score"], f"{sol['verdict']} (log {sol['log']})")


if __name__ == "__main__":
    unittest.main()
