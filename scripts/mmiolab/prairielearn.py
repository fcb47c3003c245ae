"""The PrairieLearn external grader of a lab: its results.json, and the question
folder and grader image an instructor installs.

PrairieLearn's contract, as its own sources state it (github.com/PrairieLearn/
PrairieLearn; docs/externalGrading.md unless said otherwise):

- A question's info.json enables external grading with "gradingMethod":
  "External" and an "externalGradingOptions" object: enabled, image (pullable
  by `docker pull`), entrypoint (an absolute path, executable in the image, or
  a file under /grade), serverFilesCourse (course files copied to
  /grade/serverFilesCourse), timeout (seconds, default 30, at most 600),
  enableNetworking (default off), environment. (The example question
  exampleCourse/questions/demo/autograder/codeUpload/info.json.)
- Each job gets a fresh container with /grade bound in: /grade/student (the
  submitted files), /grade/tests (the question's tests/ folder),
  /grade/serverFilesCourse, /grade/data/data.json; the entrypoint must create
  /grade/results and write /grade/results/results.json.
- results.json: "score" in [0, 1] (required when gradable); "gradable": false
  marks the submission "invalid, not gradable": no points awarded or lost, no
  attempt used; "message", "output", "images" ({label, url} data URLs) and
  "tests": [{name, description, points, max_points, message, output, images}],
  which <pl-external-grader-results> renders (apps/prairielearn/elements/
  pl-external-grader-results/pl-external-grader-results.py). No field says
  whether a student may see a test: whatever is in the file is shown.
- The file must stay under 1 MB: apps/grader-host/src/index.ts refuses a
  larger one, and it reads results.json only when the container exited 0 and
  within the timeout. apps/prairielearn/src/lib/externalGrader.ts makes a
  missing, non-finite or out-of-range score "not gradable".
- Grading containers run with 2 GiB of memory and no swap, 0.9 of a CPU
  (CpuQuota 90000 of CpuPeriod 100000), 1024 processes and a 1 GiB disk
  quota by default (apps/grader-host/src/lib/config.ts), without extra
  capabilities or devices (index.ts's createContainer): no /dev/kvm.
- Custom images must be public, on Docker Hub, ghcr.io, quay.io, GitLab's
  or Amazon's public registry, built for linux/amd64, and synced from the
  course's Sync page (docs/dockerImages.md).

So, differently from the Gradescope zip (gradescope.py), which is private:

- the grader image carries the kit files a student handout carries (it is
  public: anyone may pull it), never the lab's hidden tests;
- the hidden tests' programs travel in the question's tests/hidden/ folder,
  in the course repository that students cannot read; the entrypoint puts
  them back into the kit's lab folder before grading, and refuses to grade
  (not gradable) without them, rather than grade out of fewer points;
- tests that are not "visible" are reported as one aggregate row, its
  points and a fixed message, never their names, output or messages
  (Documentation/instructor/threat-model.rst, "Hidden tests stay hidden").
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import uuid
from typing import Any

from . import ROOT
from .config import Config
from .report import _clean_obj, _clean_text, summary_text
from .model import _WHY, NOT_CHARGED, TOO_SLOW, GradeResult, _num, atomic_write
from .template import fill

# grader-host refuses results.json over 1 MiB; leave room for what it adds.
MAX_RESULTS_BYTES = 900 << 10
MAX_TEST_OUTPUT = 16 << 10
MAX_OUTPUT = 64 << 10
MAX_MESSAGE = 2 << 10
MAX_IMAGE_BYTES = 256 << 10
HIDDEN_MESSAGE = "hidden test: output held back"
HIDDEN_NAME = "hidden tests"
# PrairieLearn's cap on a job's run time (docs/externalGrading.md: "cannot exceed 600 seconds").
TIMEOUT = 600
# No registry resolves .invalid (RFC 2606): an info.json nobody edited fails to pull,
# instead of pulling someone else's image.
DEFAULT_IMAGE = "example.invalid/mmiolab-grader-{lab}"
# A fixed namespace, so a lab's question keeps its uuid from one pack to the next.
UUID_NAMESPACE = uuid.UUID("6d6d696f-6c61-4250-a06c-6561726e0001")
KIT_IN_IMAGE = "/mmiolab"
ENTRYPOINT = "/usr/local/bin/mmiolab-pl-grade"


def _cap(text: str, limit: int) -> str:
    text = _clean_text(text)
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def _svg_image(html_text: str) -> list[dict[str, str]]:
    """The failing run's picture (the self-contained <svg> of a test's html: its
    caption is in the output already) as PrairieLearn's images entry, if small."""
    start, end = html_text.find("<svg"), html_text.rfind("</svg>")
    if start < 0 or end < start:
        return []
    data = html_text[start:end + len("</svg>")].encode("utf-8", "replace")
    if len(data) > MAX_IMAGE_BYTES:
        return []
    return [{"label": "the failing run",
             "url": "data:image/svg+xml;base64," + base64.b64encode(data).decode()}]


def results_json(result: GradeResult) -> dict[str, Any]:
    """The results.json document of `result` for PrairieLearn.

    score is the fraction of the lab's points (hidden tests' included, as in
    Gradescope's total). Only a grader failure is "not gradable"; a submission
    that did not build or was refused is graded 0 with the reason, as the
    other outputs grade it. Tests that are not "visible" are one row: their
    points and HIDDEN_MESSAGE, nothing they printed.
    """
    shown = [t for t in result.tests if t.visibility == "visible"]
    held = [t for t in result.tests if t.visibility != "visible"]
    most = result.max_score
    score = min(1.0, max(0.0, result.score / most)) if most > 0 else 0.0
    tests: list[dict[str, Any]] = []
    for t in shown:
        if t.status != "passed":
            said = f"{t.status}: {_WHY[t.status]}"
        else:
            said = "passed" if t.score >= t.max_score else "passed, with part of the points"
        entry = {"name": t.name, "description": _cap(t.description, MAX_MESSAGE),
                 "points": t.score, "max_points": t.max_score,
                 "message": said, "output": _cap(t.output, MAX_TEST_OUTPUT)}
        if t.html:
            entry["images"] = _svg_image(t.html)
        tests.append(entry)
    if held:
        tests.append({"name": f"{HIDDEN_NAME} ({len(held)})",
                      "description": "tests the handout does not have",
                      "points": sum(t.score for t in held),
                      "max_points": sum(t.max_score for t in held),
                      "message": HIDDEN_MESSAGE, "output": ""})
    gradable = result.verdict not in NOT_CHARGED
    if gradable:
        message = (f"mmiolab {result.lab}: {_num(result.score)}/{_num(most)}"
                   + ("" if result.verdict == "graded" else
                      f" (not graded in the guest: {result.verdict})"))
    elif result.verdict == TOO_SLOW:
        message = ("The grading machine was too slow to finish the tests (they were still "
                   "making progress when its time ran out), not your code: it is not "
                   "counted. Submit again later, or tell the course staff.")
    else:
        message = ("The grader failed on this submission, not your code: it is not "
                   "counted. Submit again later, or tell the course staff.")
    doc: dict[str, Any] = {
        "gradable": gradable,
        "score": score if gradable else 0.0,
        "message": message,
        "output": _cap(_summary(result), MAX_OUTPUT),
        "tests": tests,
    }
    return _fit(_clean_obj(doc))


# summary_text's words for Gradescope, whose hidden tests appear when grades are published;
# here they never appear one by one.
_GS_HELD = "are shown when grades are published"
_PL_HELD = f"are in the row \"{HIDDEN_NAME}\" below, without their output"


def _summary(result: GradeResult) -> str:
    """The student's summary (report.summary_text: visible tests only, and how many
    points the others hold), in PrairieLearn's words."""
    return summary_text(result).replace(_GS_HELD, _PL_HELD, 1)


def _fit(doc: dict[str, Any]) -> dict[str, Any]:
    """Keep the document under MAX_RESULTS_BYTES: pictures go first, then output."""
    def size() -> int:
        return len(json.dumps(doc, ensure_ascii=False).encode())
    if size() > MAX_RESULTS_BYTES:
        for t in doc["tests"]:
            t.pop("images", None)
    limit = MAX_TEST_OUTPUT
    while size() > MAX_RESULTS_BYTES and limit > 256:
        limit //= 4
        doc["output"] = _cap(doc["output"], limit * 4)
        for t in doc["tests"]:
            t["output"] = _cap(t["output"], limit)
    return doc


def write_results(result: GradeResult, path: str) -> None:
    atomic_write(path, json.dumps(results_json(result), indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------- packing






def question_uuid(lab: str) -> str:
    return str(uuid.uuid5(UUID_NAMESPACE, f"mmiolab/{lab}"))


def info_json(spec: Any, image: str) -> dict[str, Any]:
    return {
        "uuid": question_uuid(spec.name),
        "title": f"mmiolab: {spec.title}",
        "topic": "mmiolab",
        "tags": ["mmiolab", spec.name],
        "type": "v3",
        "singleVariant": True,
        "gradingMethod": "External",
        "externalGradingOptions": {
            "enabled": True,
            "image": image,
            "entrypoint": ENTRYPOINT,
            "timeout": TIMEOUT,
            "enableNetworking": False,
        },
    }


def _hidden_dir(spec: Any) -> str:
    return os.path.join("labs", spec.name, "hidden") + os.sep


def pack(spec: Any, out_dir: str, root: str = ROOT, image: str = "",
         allow_unconfined: bool = False) -> str:
    """Write out_dir/LAB/ (replacing it): question/ for the course's questions/
    folder, grader-image/ to build the image from. Returns out_dir/LAB."""
    final = os.path.join(out_dir, spec.name)
    tmp = final + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    question = os.path.join(tmp, "question")
    image_dir = os.path.join(tmp, "grader-image")
    kit = os.path.join(image_dir, "kit")
    has_hidden = _put_kit_files(spec, root, kit, os.path.join(question, "tests", "hidden"))
    _put_prebuilt(root, kit)
    _put_question(spec, question, image or DEFAULT_IMAGE.format(lab=spec.name))
    _put_image_files(spec, image_dir, has_hidden, allow_unconfined)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def _put(path: str, data: bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _mode_of(src: str) -> int:
    return 0o755 if os.access(src, os.X_OK) else 0o644


def _put_kit_files(spec: Any, root: str, kit: str, hidden_out: str) -> bool:
    """The autograder's files (no answers): the hidden tests into hidden_out (the
    course repository's question, not the public image), the rest into kit.
    Whether there were hidden tests."""
    # The instructor's side only: the image's grader never imports these.
    from . import gradescope
    from .handout import ANSWER_DIRS, HandoutError

    hidden = _hidden_dir(spec)
    has_hidden = False
    for path in gradescope.zip_members(spec, root):
        if set(path.split(os.sep)) & set(ANSWER_DIRS):
            raise HandoutError(f"{path}: an answer, which a grader cannot carry")
        member = gradescope.read_member(root, path, "a grader")
        if member is None:
            continue
        data, src = member
        if path.startswith(hidden):
            # /grade/tests/hidden/ at grading time.
            _put(os.path.join(hidden_out, path[len(hidden):]), data, _mode_of(src))
            has_hidden = True
        else:
            _put(os.path.join(kit, path), data, _mode_of(src))
    return has_hidden


def _put_prebuilt(root: str, kit: str) -> None:
    """The lab kernel and initramfs, built (as the Gradescope zip carries them):
    the image builds no kernel."""
    from .handout import prebuilt

    built = prebuilt(root)
    for name, src in built.files:
        os.makedirs(os.path.dirname(os.path.join(kit, name)), exist_ok=True)
        shutil.copyfile(src, os.path.join(kit, name))
        os.chmod(os.path.join(kit, name), _mode_of(src))
    for name, data in built.generated.items():
        _put(os.path.join(kit, name), data)
    for name, target in built.links:             # a folder, unlike a zip, keeps links
        os.makedirs(os.path.dirname(os.path.join(kit, name)), exist_ok=True)
        os.symlink(target, os.path.join(kit, name))


def _put_question(spec: Any, question: str, image: str) -> None:
    """The question's info.json, question.html and the starter files its editors open."""
    editors = []
    for name in spec.files:
        starter = os.path.join(spec.dir, "starter", name)
        if os.path.isfile(starter):
            with open(starter, "rb") as f:
                _put(os.path.join(question, "clientFilesQuestion", name), f.read())
            editors.append(fill("prairielearn-editor.html", name=name))
        else:
            editors.append(f'  <pl-file-editor file-name="{name}" '
                           f'ace-mode="ace/mode/c_cpp"></pl-file-editor>')
    doc = info_json(spec, image)
    _put(os.path.join(question, "info.json"), (json.dumps(doc, indent=2) + "\n").encode())
    _put(os.path.join(question, "question.html"), fill(
        "prairielearn-question.html", lab=spec.name,
        title=html.escape(spec.title, quote=False), editors="\n".join(editors)).encode())


def _put_image_files(spec: Any, image_dir: str, has_hidden: bool,
                     allow_unconfined: bool) -> None:
    """The grader image's entrypoint and Dockerfile."""
    flags = " --allow-unconfined-build" if allow_unconfined else ""
    _put(os.path.join(image_dir, "entrypoint.sh"), fill(
        "prairielearn-entrypoint.sh", lab=spec.name, kit=KIT_IN_IMAGE, flags=flags,
        has_hidden="yes" if has_hidden else "no").encode(), 0o755)
    _put(os.path.join(image_dir, "Dockerfile"), fill(
        "prairielearn-Dockerfile", lab=spec.name, kit=KIT_IN_IMAGE,
        entrypoint=ENTRYPOINT).encode())


def default_out(cfg: Config | None = None) -> str:
    return os.path.join((cfg or Config.from_env()).build, "prairielearn")
