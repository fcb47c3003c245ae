"""The kit's configuration for the tests, built once from the environment as
python3 -m mmiolab builds a command's. The tests are an entry point: the
library reads no environment itself, so a test passes CFG (or a Config of
its own) to what it calls."""

from mmiolab import kernel, timeline
from mmiolab.config import Config

CFG = Config.from_env()
BUILD = CFG.build                  # everything generated (MMIOLAB_BUILD)
TREE = kernel.tree(CFG)            # the lab kernel: TREE.src, TREE.obj, TREE.bzimage


def ring() -> timeline.Ring:
    """The card's register map, from the lab kernel's mmiosim_ring.h (read when
    a test asks: a test that draws no trace needs no kernel)."""
    return timeline.ring(TREE.src)
