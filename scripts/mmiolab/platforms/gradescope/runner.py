"""Gradescope's grading image and job, as its machines make and run them
(gradescope-autograders.readthedocs.io/en/latest/specs/): the autograder zip
unzipped in /autograder/source and setup.sh run there while the image builds
(with the grading limits: the build is where setup measures the machine), then
run_autograder copied to /autograder; per submission /autograder/run_autograder,
the files in /autograder/submission, the result read from
/autograder/results/results.json. scripts/containers runs these in Docker,
scripts/cleanroot --check gradescope in a plain root.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ...config import Config
from ..base import ImageRecipe, JobSpec, Reading, RootCheck
from . import PLATFORM

# The container's paths are the platform's contract (PLATFORM), at its defaults.
SUBMISSION = PLATFORM.submission(Config())
RESULTS = PLATFORM.results_path(Config())
ROOT = PLATFORM.root(Config())

DOCKERFILE = """\
# Gradescope's image build (gradescope-autograders.readthedocs.io, specs): the
# zip in {root}/source, setup.sh run there once as root, run_autograder
# copied to {root}.
FROM {base}
ARG DEBIAN_FRONTEND=noninteractive
# Gradescope's base images have unzip; a minbase root does not.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends unzip >/dev/null
COPY autograder.zip /tmp/autograder.zip
RUN mkdir -p {root}/source {submission} {results} \\
 && cd {root}/source && unzip -q /tmp/autograder.zip && rm /tmp/autograder.zip
RUN cd {root}/source && t0=$(date +%s) && bash ./setup.sh \\
 && echo "containers: setup.sh done in $(( $(date +%s) - t0 )).0s"
RUN cp {root}/source/run_autograder {root}/run_autograder \\
 && chmod 755 {root}/run_autograder
"""

# The kit's results checker before platforms/ existed (fdb8425 and older), for
# scripts/containers --kit of such a kit: MODULE:NAME.
CHECKER_BEFORE_PLATFORMS = "mmiolab.report:gradescope_problems"


def zip_name(lab: str) -> str:
    """The autograder zip the pack subcommand makes of `lab`."""
    return f"mmiolab-{lab}-autograder.zip"


def image(lab: str, base: str, packed: str, work: str) -> ImageRecipe:
    """The image of `lab`'s zip (packed: the folder the kit packed it into) on
    `base`, its build context made in `work`."""
    os.makedirs(work, exist_ok=True)
    shutil.copyfile(os.path.join(packed, zip_name(lab)), os.path.join(work, "autograder.zip"))
    dockerfile = os.path.join(work, "Dockerfile")
    with open(dockerfile, "w") as f:
        f.write(DOCKERFILE.format(base=base, root=ROOT, submission=SUBMISSION,
                                  results=os.path.dirname(RESULTS)))
    return ImageRecipe(context=work, dockerfile=dockerfile, packed=packed)


def job(recipe: ImageRecipe, folder: str, source: str, file: str) -> JobSpec:
    """One submission (`source`, handed in as `file`): its folder and the
    results folder bound where Gradescope puts them, run_autograder run."""
    sub, res = os.path.join(folder, "submission"), os.path.join(folder, "results")
    os.makedirs(sub)
    os.makedirs(res)
    shutil.copyfile(source, os.path.join(sub, file))
    return JobSpec(options=("-v", f"{sub}:{SUBMISSION}", "-v", f"{res}:{os.path.dirname(RESULTS)}"),
                   command=(f"{ROOT}/run_autograder",),
                   results=os.path.join(res, os.path.basename(RESULTS)))


def read(doc: Any) -> Reading:
    """Gradescope's score and tests: its total, the tests not "passed", and the
    kit's maximum from extra_data (Gradescope sums max_score itself)."""
    if not isinstance(doc, dict):
        return Reading(None, None, [], "results.json is not a JSON object")
    tests = doc.get("tests", [])
    failed = [t.get("name", "?") for t in tests if t.get("status") != "passed"]
    extra = doc.get("extra_data", {}).get("mmiolab", {})
    return Reading(doc.get("score"), extra.get("max_score"), failed)


# The image build and two jobs (starter, solution) in a plain root.
ROOT_CHECK = RootCheck(
    # What an image needs to unpack the zip as Gradescope does.
    prereqs=("unzip",),
    job=f"""
mkdir -p {ROOT}/source {SUBMISSION} {os.path.dirname(RESULTS)}
cd {ROOT}/source
unzip -q /mnt/art/{zip_name("@LAB@")}
echo "cleanroot: autograder zip, $(du -sh /mnt/art/{zip_name("@LAB@")} | cut -f1)"
before=$(dpkg-query -W | wc -l)
t0=$(date +%s)
bash setup.sh
echo "mmiolab: setup (setup.sh) done in $(( $(date +%s) - t0 )).0s"
echo "cleanroot: packages installed by setup: $(( $(dpkg-query -W | wc -l) - before ))"
cp run_autograder {ROOT}/run_autograder
for which in starter solution; do
	rm -f {SUBMISSION}/* {RESULTS}
	cp /mnt/art/$which.c {SUBMISSION}/@FILE@
	t0=$(date +%s)
	{ROOT}/run_autograder | tail -n 3 || true
	echo "mmiolab: grading of the $which done in $(( $(date +%s) - t0 )).0s"
	/usr/bin/python3 -c 'import json, sys; sys.path.insert(0, "scripts")
from mmiolab.platforms import PLATFORMS
doc = json.load(open("{RESULTS}"))
bad = PLATFORMS["{PLATFORM.name}"].problems(doc)
print("cleanroot:", sys.argv[1], "results.json:", doc["score"], "points;",
      "valid" if not bad else "INVALID: " + "; ".join(bad))' "$which"
done
""")
