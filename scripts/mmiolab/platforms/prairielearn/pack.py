"""Pack a lab's PrairieLearn external grader: the question folder for the
course repository and the folder its grader image is built from (an
instructor's tool: the image's grader never imports it).

What goes where, and why, is in the package's docstring (the contract, from
PrairieLearn's own sources): the image is public and carries what a student
handout carries plus the lab kernel, built; the hidden tests' programs go in
the question's tests/hidden/, which students cannot read.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import uuid
from typing import Any

from ... import ROOT
from ...config import Config
from ...handout import ANSWER_DIRS, HandoutError, prebuilt
from ...template import fill
from ..gradescope.pack import read_member, zip_members
from . import PLATFORM

# The question's timeout: PrairieLearn's cap on a job's run time (PLATFORM.container).
TIMEOUT = PLATFORM.container.timeout
# No registry resolves .invalid (RFC 2606): an info.json nobody edited fails to pull,
# instead of pulling someone else's image.
DEFAULT_IMAGE = "example.invalid/mmiolab-grader-{lab}"
# A fixed namespace, so a lab's question keeps its uuid from one pack to the next.
UUID_NAMESPACE = uuid.UUID("6d6d696f-6c61-4250-a06c-6561726e0001")
KIT_IN_IMAGE = "/mmiolab"
ENTRYPOINT = "/usr/local/bin/mmiolab-pl-grade"


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
         allow_unconfined: bool = False, *, cfg: Config) -> str:
    """Write out_dir/LAB/ (replacing it): question/ for the course's questions/
    folder, grader-image/ to build the image from. Returns out_dir/LAB."""
    final = os.path.join(out_dir, spec.name)
    tmp = final + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    question = os.path.join(tmp, "question")
    image_dir = os.path.join(tmp, "grader-image")
    kit = os.path.join(image_dir, "kit")
    has_hidden = _put_kit_files(spec, root, kit, os.path.join(question, "tests", "hidden"))
    _put_prebuilt(root, kit, cfg)
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
    hidden = _hidden_dir(spec)
    has_hidden = False
    for path in zip_members(spec, root):
        if set(path.split(os.sep)) & set(ANSWER_DIRS):
            raise HandoutError(f"{path}: an answer, which a grader cannot carry")
        member = read_member(root, path, "a grader")
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


def _put_prebuilt(root: str, kit: str, cfg: Config) -> None:
    """The lab kernel and initramfs, built (as the Gradescope zip carries them):
    the image builds no kernel."""
    built = prebuilt(root, cfg=cfg)
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


def default_out(cfg: Config) -> str:
    return os.path.join(cfg.build, "prairielearn")
