"""PrairieLearn's grading image and job, as its grader host makes and runs them
(the contract and its sources: this package's docstring): the grader image
built from the kit's own Dockerfile (grader-image/, its FROM line pointed at
the base we have: no registry here); per submission the image's entrypoint,
with /grade/student, /grade/tests (the question's tests/), /grade/data/
data.json and the result read from /grade/results/results.json.
scripts/containers runs these in Docker, scripts/cleanroot --check
prairielearn in a plain root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

from ...config import Config
from ..base import ImageRecipe, JobSpec, Reading, RootCheck
from . import PLATFORM
from .pack import ENTRYPOINT, KIT_IN_IMAGE

GRADE = PLATFORM.root(Config())                 # /grade, bound in per job
RESULTS = os.path.relpath(PLATFORM.results_path(Config()), GRADE)


def image(lab: str, base: str, packed: str, work: str) -> ImageRecipe:
    """The grader image of `lab` (packed: the folder the kit packed it into,
    LAB/question and LAB/grader-image) from the kit's Dockerfile, FROM `base`;
    that Dockerfile written in `work`."""
    ctx = os.path.join(packed, lab, "grader-image")
    with open(os.path.join(ctx, "Dockerfile")) as f:
        text = f.read()
    said = re.search(r"(?m)^FROM\s+(\S+)", text)
    if said is None:
        raise ValueError(f"{ctx}/Dockerfile has no FROM line")
    os.makedirs(work, exist_ok=True)
    dockerfile = os.path.join(work, "Dockerfile")
    with open(dockerfile, "w") as f:
        f.write(text[:said.start(1)] + base + text[said.end(1):])
    return ImageRecipe(context=ctx, dockerfile=dockerfile, packed=os.path.join(packed, lab),
                       note=f"{lab}'s grader image: the kit's Dockerfile, FROM {said.group(1)} "
                            f"replaced by FROM {base} (no registry here)")


def job(recipe: ImageRecipe, folder: str, source: str, file: str) -> JobSpec:
    """One submission (`source`, handed in as `file`) as grader-host lays out
    /grade: student/, tests/ (the question's), data/data.json,
    serverFilesCourse/; the question's entrypoint run."""
    question = os.path.join(recipe.packed, "question")
    grade = os.path.join(folder, "grade")
    os.makedirs(os.path.join(grade, PLATFORM.student))
    os.makedirs(os.path.join(grade, "data"))
    os.makedirs(os.path.join(grade, "serverFilesCourse"))
    shutil.copyfile(source, os.path.join(grade, PLATFORM.student, file))
    shutil.copytree(os.path.join(question, "tests"), os.path.join(grade, "tests"))
    with open(os.path.join(question, "info.json")) as f:
        entry = str(json.load(f)["externalGradingOptions"]["entrypoint"])
    with open(os.path.join(grade, "data", "data.json"), "w") as f:
        json.dump({"submitted_answers": {"_files": [{"name": file}]}}, f)
    return JobSpec(options=("-v", f"{grade}:{GRADE}", "--entrypoint", entry), command=(),
                   results=os.path.join(grade, RESULTS))


def _failed(test: dict[str, Any]) -> bool:
    """A test row that did not pass: a visible test's message is "passed..."
    or its status and why (results_json); the hidden tests' one row says only
    its points."""
    message = str(test.get("message", ""))
    if message.startswith("passed"):
        return False
    if message.startswith(("failed", "crashed", "error", "skipped")):
        return True
    return bool(test.get("points", 0) < test.get("max_points", 0))


def read(doc: Any) -> Reading:
    """PrairieLearn's grade: score is a fraction, the points are the tests'
    max_points; "gradable": false is no grade at all (no attempt used)."""
    if not isinstance(doc, dict):
        return Reading(None, None, [], "results.json is not a JSON object")
    if doc.get("gradable") is False:
        return Reading(None, None, [], f"not gradable: {doc.get('message', '')}", graded=False)
    score = doc.get("score")
    if not isinstance(score, (int, float)) or not 0 <= score <= 1:
        return Reading(None, None, [], f"results.json INVALID: score {score!r}")
    tests = doc.get("tests", [])
    most = sum(t.get("max_points", 0) for t in tests)
    return Reading(round(score * most, 2), most, [t.get("name", "?") for t in tests
                                                 if _failed(t)])


# No kit before platforms/ had a PrairieLearn checker of its own.
CHECKER_BEFORE_PLATFORMS = ""

# As the grader image is built (grader-image/Dockerfile: COPY kit/, RUN
# scripts/deps grade, COPY entrypoint.sh), then a job as PrairieLearn runs
# one: /grade/student, /grade/tests, the entrypoint.
ROOT_CHECK = RootCheck(prereqs=(), job=f"""
cp -R /mnt/art/@LAB@/grader-image/kit {KIT_IN_IMAGE}
chmod a+x {KIT_IN_IMAGE}
echo "cleanroot: grader image folder, $(du -sh /mnt/art/@LAB@/grader-image | cut -f1)"
before=$(dpkg-query -W | wc -l)
t0=$(date +%s)
{KIT_IN_IMAGE}/scripts/deps grade
echo "mmiolab: setup (scripts/deps grade) done in $(( $(date +%s) - t0 )).0s"
echo "cleanroot: packages installed by setup: $(( $(dpkg-query -W | wc -l) - before ))"
install -m 755 /mnt/art/@LAB@/grader-image/entrypoint.sh {ENTRYPOINT}
for which in starter solution; do
	rm -rf {GRADE} && mkdir -p {GRADE}/{PLATFORM.student} {GRADE}/data
	cp -R /mnt/art/@LAB@/question/tests {GRADE}/tests
	cp /mnt/art/$which.c {GRADE}/{PLATFORM.student}/@FILE@
	t0=$(date +%s)
	{ENTRYPOINT} | tail -n 3 || true
	echo "mmiolab: grading of the $which done in $(( $(date +%s) - t0 )).0s"
	/usr/bin/python3 -c 'import json, sys; sys.path.insert(0, "{KIT_IN_IMAGE}/scripts")
from mmiolab.platforms import PLATFORMS
doc = json.load(open("{GRADE}/{RESULTS}"))
bad = PLATFORMS["{PLATFORM.name}"].problems(doc)
print("cleanroot:", sys.argv[1], "results.json: gradable", doc.get("gradable", True),
      "score", doc.get("score"), "valid" if not bad else "INVALID: " + "; ".join(bad))' "$which"
done
""")
