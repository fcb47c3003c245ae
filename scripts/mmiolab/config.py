"""The kit's configuration: one frozen object, built once by the command.

python3 -m mmiolab builds a Config from the environment and its arguments
(Config.from_env(os.environ, smp=4)) and passes it down: kernel.tree(cfg),
vm.VMConfig.from_config(cfg), GradeOptions(cfg=cfg), ... Only the entry
points read the environment (python3 -m mmiolab, scripts/cleanroot, the
tests' kitcfg.py): every library function that needs a setting takes the
Config, with no default that would read the environment behind its caller.

Every MMIOLAB_* variable the tools read is in ENV below, with its meaning.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from . import ROOT, MmiolabError


class ConfigError(MmiolabError):
    """An MMIOLAB_* variable whose value is not of its kind."""


@dataclasses.dataclass(frozen=True)
class Config:
    build: str = os.path.join(ROOT, "build")     # everything generated
    kernel_tarball: str = "/usr/src/linux-source-6.12.tar.xz"
    patches: str = os.path.join(ROOT, "patches")
    debug: bool = False                          # the debug kernel is the one this process uses
    smp: int = 2                                 # the guest's virtual CPUs
    memory: str = "512M"                         # the guest's memory
    accel: str = "auto"                          # auto | kvm | tcg
    sandbox_uid: int = 65534                     # the confined build's ids (when run as root)
    sandbox_gid: int = 65534
    # The confinement level (sandbox.LEVELS): "" tries bubblewrap, then the
    # jail; a level's name forces it (tests, instructors).
    confine: str = ""
    # The jail's first uid and gid (jail.py): slot N runs as jail_uid + N and
    # jail_gid + N, ids nothing else on the machine may use (every process of
    # such a uid is killed when its step ends). 65536..99999: above the 16-bit
    # ids and below the subordinate ids useradd hands out (from 100000).
    jail_uid: int = 65600
    jail_gid: int = 65600
    qemu_monitor: str = ""                       # debugging: a QEMU monitor socket
    autograder: str = "/autograder"              # Gradescope's container root
    prairielearn: str = "/grade"                 # PrairieLearn's container root
    # Seconds a platform gives one grading job, where its instructor raised
    # it (0: the platform's default, Platform.time_limit).
    time_limit: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Config:
        """The environment's settings (os.environ by default), then overrides
        (None values are ignored: an argument the user did not give)."""
        environ = os.environ if environ is None else environ
        values = {}
        for name, var in ENV.items():
            if var in environ:
                value = environ[var]
                kind = type(getattr(cls, name))
                try:
                    values[name] = value == "1" if kind is bool else kind(value)
                except ValueError:
                    raise ConfigError(f"{var}={value!r}: not an integer") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def __post_init__(self) -> None:
        if self.confine not in CONFINE_LEVELS:
            raise ConfigError(f"MMIOLAB_CONFINE={self.confine!r}: not one of "
                              f"{', '.join(l for l in CONFINE_LEVELS if l)} (or empty: "
                              f"the first that works)")


# The values of Config.confine: sandbox.LEVELS, and "" for the first that works.
CONFINE_LEVELS = ("", "bubblewrap", "jail")


# Config field: the environment variable that sets it (tests, Makefiles and
# users set these; the names and meanings are part of the kit's interface).
ENV = {
    "build": "MMIOLAB_BUILD",
    "kernel_tarball": "MMIOLAB_KERNEL_TARBALL",
    "patches": "MMIOLAB_PATCHES",
    "debug": "MMIOLAB_DEBUG",                # "1": make kernel DEBUG=1
    "smp": "MMIOLAB_SMP",
    "memory": "MMIOLAB_MEM",
    "accel": "MMIOLAB_ACCEL",
    "sandbox_uid": "MMIOLAB_SANDBOX_UID",
    "sandbox_gid": "MMIOLAB_SANDBOX_GID",
    "confine": "MMIOLAB_CONFINE",            # bubblewrap | jail: force that level
    "jail_uid": "MMIOLAB_JAIL_UID",
    "jail_gid": "MMIOLAB_JAIL_GID",
    "qemu_monitor": "MMIOLAB_QEMU_MONITOR",
    "autograder": "MMIOLAB_AUTOGRADER",
    "prairielearn": "MMIOLAB_PRAIRIELEARN",
    "time_limit": "MMIOLAB_TIME_LIMIT",      # seconds: a platform's job limit as set
}
