#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder's image
# (any Debian or Ubuntu base: 12, 13, 22.04, 24.04): the packages grading
# needs, from the image's own archive. The lab kernel and the guest's
# initramfs come built (prebuilt/): no kernel is built here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# The module build reaches the kernel source through this link (a zip may not
# keep links).
ln -sfn ../src prebuilt/kernel/obj/source
# Module builds run as an unprivileged user (bubblewrap), who must be able to
# enter the folders down to the kernel tree.
chmod a+x .. .
scripts/deps grade
# The hidden tests' programs: the grader's (root's) alone, whatever confines the build.
find labs -mindepth 2 -maxdepth 2 -name hidden -type d -exec chmod -R go-rwx {} +
# Prepare the jail now (where the image's containers forbid new namespaces,
# bubblewrap cannot work and the jail confines the builds), and tell the
# instructor now (in the image's build log) how builds will be confined.
/usr/bin/python3 -c 'import sys; sys.path.insert(0, "scripts")
from mmiolab.config import Config
from mmiolab.lab import setup_confinement
print(setup_confinement(Config.from_env())[1])'
# How fast this image runs the lab guest, and how long a submission will take
# here against Gradescope's time limit (a short guest; the limit is the one
# the grader keeps to: platforms/gradescope's 10 minutes, or
# MMIOLAB_TIME_LIMIT). Where the image is built on a machine other than the
# grading one, it says so of the builder; graded runs measure their own
# machine again.
scripts/kit calibrate --platform gradescope ||
	echo "mmiolab: WARNING: see above: submissions may not fit Gradescope's time limit"
