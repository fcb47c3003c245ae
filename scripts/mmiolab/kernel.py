"""Unpack, patch, configure and build the lab kernel.

The tree comes from Debian's linux-source-6.12 tarball and is never edited by
hand: patches/series is the source of truth. A stamp records what the tree and
the build were made from, so that a re-run with nothing changed does nothing,
and a changed series is applied to a fresh tree (ccache keeps that rebuild
short).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any, cast

from . import ROOT, MmiolabError
from .config import Config
from .progress import CommandError, run_logged, say, step

FRAGMENT = os.path.join(ROOT, "vm", "kernel.config")
DEBUG_FRAGMENT = os.path.join(ROOT, "vm", "debug.config")
# A student handout carries the lab kernel built (scripts/handout): the kernel
# image and what an out-of-tree module build needs, in the kit's own src/obj
# layout. Students do not build kernels.
PREBUILT = os.path.join(ROOT, "prebuilt", "kernel")
PREBUILT_INFO = "built-by.json"


@dataclasses.dataclass(frozen=True)
class Tree:
    """One lab kernel: its folder (src/ the patched tree, obj/ the build,
    stamp.json), how it is configured and what it is made from (Debian's
    tarball, the patch series). The lab kernel is build/kernel, or a
    handout's prebuilt/kernel; the debug kernel (lockdep, KFENCE...) is
    build/kernel-debug."""
    kdir: str
    debug: bool = False
    prebuilt: bool = False
    tarball: str = Config.kernel_tarball
    patches: str = Config.patches

    @property
    def src(self) -> str:
        return os.path.join(self.kdir, "src")

    @property
    def obj(self) -> str:
        return os.path.join(self.kdir, "obj")

    @property
    def stamp(self) -> str:
        return os.path.join(self.kdir, "stamp.json")

    @property
    def bzimage(self) -> str:
        return os.path.join(self.obj, "arch", "x86", "boot", "bzImage")

    @property
    def what(self) -> str:          # progress lines
        return "debug kernel" if self.debug else "kernel"

    @property
    def fragments(self) -> list[str]:
        return [FRAGMENT, DEBUG_FRAGMENT] if self.debug else [FRAGMENT]

    # A cold build (empty ccache), measured with scripts/coldstart on a 2-CPU
    # Debian 12 machine (Documentation/figures/coldstart.txt): files compiled,
    # and CPU-seconds of the build step. For progress lines and the demo's
    # estimate, not for tests.
    @property
    def cold_files(self) -> int:
        return 1027 if self.debug else 1018

    @property
    def cold_cpu_seconds(self) -> int:
        return 930 if self.debug else 880


def tree(cfg: Config, debug: bool | None = None) -> Tree:
    """The kernel cfg uses (cfg.debug: MMIOLAB_DEBUG=1, make kernel DEBUG=1), or
    the one asked for: the lab kernel (a handout's prebuilt one where there is
    one) or the debug kernel."""
    debug = cfg.debug if debug is None else debug
    if not debug and os.path.isdir(PREBUILT):
        return Tree(PREBUILT, prebuilt=True, tarball=cfg.kernel_tarball, patches=cfg.patches)
    return Tree(os.path.join(cfg.build, "kernel-debug" if debug else "kernel"), debug,
                tarball=cfg.kernel_tarball, patches=cfg.patches)


# Fixed build identity: identical inputs give identical compiler command lines,
# which is what lets ccache hit across clones and re-unpacked trees.
BUILD_ENV = {
    "KBUILD_BUILD_TIMESTAMP": "2026-01-01",
    "KBUILD_BUILD_USER": "mmiolab",
    "KBUILD_BUILD_HOST": "mmiolab",
    "CCACHE_BASEDIR": ROOT,
    "CCACHE_NOHASHDIR": "true",
    "CCACHE_SLOPPINESS": "time_macros",
    # Depend mode: on a miss ccache runs the compiler once and takes the
    # headers from Kbuild's -MMD file, instead of running the preprocessor
    # first. A cold lab kernel build step: 441 s instead of 564 s on 2 CPUs;
    # a re-unpacked tree still hits (892 of 893): Documentation/figures/coldstart.txt.
    "CCACHE_DEPEND": "true",
}


class MissingError(MmiolabError, FileNotFoundError):
    """What a kernel build needs is missing (the message says what to run)."""


class PatchError(MmiolabError):
    """A patch of the series does not apply cleanly (no fuzz allowed)."""


class ConfigError(MmiolabError):
    """The config fragment asks for options the resulting .config does not have."""


def series(patch_dir: str) -> list[str]:
    path = os.path.join(patch_dir, "series")
    if not os.path.exists(path):
        return []
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    return names


def _digest(paths: list[str], extra: str = "") -> str:
    """Of the files' names and contents, not their folders: a kit that moves (or
    a student handout unpacked elsewhere) keeps using the kernel it built."""
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def source_digest(t: Tree) -> str:
    st = os.stat(t.tarball)
    names = series(t.patches)
    return _digest([os.path.join(t.patches, "series")] if names else [],
                   f"{t.tarball}:{st.st_size}:{int(st.st_mtime)}") + ":" + \
        _digest([os.path.join(t.patches, n) for n in names])


def config_digest(t: Tree) -> str:
    return _digest(t.fragments)


def _load_stamp(t: Tree) -> dict[str, Any]:
    try:
        with open(t.stamp) as f:
            return cast(dict[str, Any], json.load(f))
    except (OSError, ValueError):
        return {}


def _save_stamp(t: Tree, stamp: dict[str, Any]) -> None:
    tmp = t.stamp + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stamp, f, indent=1)
    os.replace(tmp, t.stamp)


def unpack(dest: str, tarball: str) -> None:
    """Unpack the Debian tarball so that its top folder becomes dest."""
    if not os.path.exists(tarball):
        raise MissingError(f"{tarball} is missing: run 'make deps' (package linux-source-6.12)")
    parent = os.path.dirname(dest)
    tmp = dest + ".unpack"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    subprocess.run(["tar", "-xf", tarball, "-C", tmp], check=True)
    (top,) = os.listdir(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(os.path.join(tmp, top), dest)
    os.rmdir(tmp)
    assert os.path.dirname(dest) == parent


def apply_series(tree: str, patch_dir: str, tarball: str) -> int:
    """Apply every patch of the series without fuzz; PatchError names the one that fails."""
    names = series(patch_dir)
    for n, name in enumerate(names, 1):
        path = os.path.join(patch_dir, name)
        if not os.path.exists(path):
            raise PatchError(f"patch {n}/{len(names)} {name}: listed in series but missing")
        cmd = ["patch", "-p1", "-F0", "-N", "-s", "--no-backup-if-mismatch", "-i", path]
        res = subprocess.run(cmd + ["--dry-run"], cwd=tree, capture_output=True, text=True)
        if res.returncode:
            raise PatchError(f"patch {n}/{len(names)} {name} does not apply to "
                             f"{os.path.basename(tarball)}:\n{res.stdout}{res.stderr}")
        subprocess.run(cmd, cwd=tree, check=True, capture_output=True)
    return len(names)


def make_cmd(*targets: str, t: Tree, jobs: int | None = None) -> list[str]:
    jobs = jobs or (os.cpu_count() or 1) + 1
    cc = "ccache gcc" if shutil.which("ccache") else "gcc"
    return ["make", "-C", t.src, f"O={t.obj}", f"-j{jobs}", f"CC={cc}", f"HOSTCC={cc}", *targets]


def build_env() -> dict[str, str]:
    # Not the flags of a make that runs the kit (make -s demo): Kbuild would
    # go silent and the progress line count no files.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return {**env, **BUILD_ENV}


def configure(t: Tree) -> None:
    os.makedirs(t.obj, exist_ok=True)
    merged = os.path.join(t.kdir, "fragment.config")
    with open(merged, "w") as out:
        for frag in t.fragments:
            with open(frag) as f:
                out.write(f.read())
    env = {**build_env(), "KCONFIG_ALLCONFIG": merged}
    run_logged(make_cmd("allnoconfig", t=t), os.path.join(t.kdir, "config.log"), "configure",
               env=env)
    check_config(os.path.join(t.obj, ".config"), merged)


def check_config(config: str, fragment: str) -> None:
    """Every option the fragment sets must have survived Kconfig's dependency rules."""
    have = {}
    with open(config) as f:
        for line in f:
            line = line.strip()
            if line.startswith("CONFIG_"):
                k, v = line.split("=", 1)
                have[k] = v
            elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
                have[line[2:-11]] = "n"
    lost = []
    with open(fragment) as f:
        for line in f:
            line = line.strip()
            if line.startswith("CONFIG_"):
                k, v = line.split("=", 1)
                if have.get(k, "n") != v:
                    lost.append(f"{k}={v} (got {have.get(k, 'n')})")
    if lost:
        raise ConfigError("the kernel config lost options from " +
                          os.path.relpath(fragment, ROOT) + ":\n  " + "\n  ".join(lost))


def patches_digest(patch_dir: str) -> str:
    names = series(patch_dir)
    return _digest([os.path.join(patch_dir, "series")] + [os.path.join(patch_dir, n)
                                                          for n in names] if names else [])


def prebuilt_info(kdir: str = PREBUILT) -> dict[str, Any]:
    try:
        with open(os.path.join(kdir, PREBUILT_INFO)) as f:
            return cast(dict[str, Any], json.load(f))
    except (OSError, ValueError):
        return {}


def use_prebuilt(t: Tree) -> str:
    """A handout's kernel, if it was built from this kit's patches and config."""
    info = prebuilt_info(t.kdir)
    if not os.path.exists(t.bzimage):
        raise MissingError(f"{os.path.relpath(t.bzimage, ROOT)} is missing: the handout "
                                f"is incomplete (unpack it again)")
    changed = [what for what, key, now in (("patches/", "patches", patches_digest(t.patches)),
                                           ("vm/kernel.config", "config", config_digest(t)))
               if info.get(key) != now]
    if changed:
        raise ConfigError(
            f"{' and '.join(changed)} differ from what the handout's kernel was built from "
            f"(kit {info.get('kit', '?')}): restore them from the handout. (To build a kernel "
            f"of your own instead, which takes minutes and needs linux-source-6.12: remove "
            f"prebuilt/kernel, then make kernel.)")
    say(f"kernel: prebuilt by the kit at {info.get('kit', '?')} (Linux {info.get('release', '?')})")
    return t.bzimage


def is_built(t: Tree) -> bool:
    """Whether build() has nothing to do (a handout's kernel counts as built)."""
    if t.prebuilt:
        return True
    stamp = _load_stamp(t)
    return os.path.exists(t.bzimage) and \
        stamp.get("built") == source_digest(t) + config_digest(t) == stamp.get("config")


@contextlib.contextmanager
def building(t: Tree) -> Iterator[None]:
    """One build of a tree at a time on this host: two makes in one object
    folder break each other's dependency files (seen: a test's build beside
    `make kernel` failed with "fixdep: error opening file: mm/.debug.o.d")."""
    os.makedirs(t.kdir, exist_ok=True)
    fd = os.open(os.path.join(t.kdir, "build.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"{t.what}: another process is building {t.kdir}; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                    # closing also unlocks


def build(force: bool = False, *, t: Tree) -> str:
    """Bring the kernel t (tree(cfg)) up to date with patches/ and its
    config fragments; returns bzImage. Another process building the same
    tree is waited for, and what it built is used."""
    if t.prebuilt:
        return use_prebuilt(t)
    with building(t):
        return _build(force, t)


def _build(force: bool, t: Tree) -> str:
    stamp = _load_stamp(t)
    src_d, cfg_d = source_digest(t), config_digest(t)
    if force or stamp.get("source") != src_d or not os.path.isdir(t.src):
        with step(f"{t.what}: unpack and patch", tick=True):
            stamp = {}
            os.makedirs(t.kdir, exist_ok=True)
            unpack(t.src, t.tarball)
            n = apply_series(t.src, t.patches, t.tarball)
            say(f"applied {n} patches from patches/series")
        stamp["source"] = src_d
        _save_stamp(t, stamp)
    # The series may add Kconfig options, so a new tree is configured anew.
    cfg_d = src_d + cfg_d
    if stamp.get("config") != cfg_d or not os.path.exists(os.path.join(t.obj, ".config")):
        with step(f"{t.what}: configure"):
            configure(t)
        stamp["config"] = cfg_d
        stamp.pop("built", None)
        _save_stamp(t, stamp)
    want = cfg_d
    if stamp.get("built") == want and os.path.exists(t.bzimage):
        say(f"{t.what}: up to date")
        return t.bzimage
    log = os.path.join(t.kdir, "build.log")
    with step(f"{t.what}: build (full log: {log})"):
        run_logged(make_cmd("bzImage", "modules", t=t), log, f"{t.what} build",
                   env=build_env(), count_prefix="  CC", count_about=t.cold_files)
    stamp["built"] = want
    _save_stamp(t, stamp)
    return t.bzimage


BISECT_FRAGMENT = os.path.join(ROOT, "vm", "bisect.config")


def changed_c_files(patch: str) -> list[str]:
    """The .c files a patch changes or adds (paths in the tree)."""
    out = []
    with open(patch, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("+++ b/") and line.rstrip().endswith(".c"):
                out.append(line[6:].rstrip())
    return out


def bisect_build(cfg: Config, dest: str = "") -> list[str]:
    """Build every prefix of the series (patch 1, 1-2, ...): each must build,
    and compile every .c file its last patch changes.

    Applies the patches one at a time to one fresh tree and rebuilds
    incrementally, reconfiguring after each (a patch may add options), with
    vm/bisect.config on top of the lab config. Returns the patches built;
    CommandError names the first that breaks, or whose .c files the build
    did not compile (a prefix that leaves them unconfigured proves nothing).
    dest defaults to build/bisect.
    """
    dest = dest or os.path.join(cfg.build, "bisect")
    src, obj = os.path.join(dest, "src"), os.path.join(dest, "obj")
    unpack(src, cfg.kernel_tarball)
    shutil.rmtree(obj, ignore_errors=True)
    os.makedirs(obj)
    merged = os.path.join(dest, "bisect-fragment.config")
    with open(merged, "w") as out:
        for frag in (FRAGMENT, BISECT_FRAGMENT):
            with open(frag) as f:
                out.write(f.read())
    names = series(cfg.patches)
    done = []
    for n, name in enumerate(names, 1):
        one = os.path.join(dest, "one")
        shutil.rmtree(one, ignore_errors=True)
        os.makedirs(one)
        shutil.copy(os.path.join(cfg.patches, name), one)
        with open(os.path.join(one, "series"), "w") as f:
            f.write(name + "\n")
        apply_series(src, one, cfg.kernel_tarball)
        make = ["make", "-C", src, f"O={obj}", f"-j{(os.cpu_count() or 1) + 1}",
                f"CC={'ccache gcc' if shutil.which('ccache') else 'gcc'}"]
        with step(f"bisect {n}/{len(names)}: {name}"):
            started = time.time()
            run_logged(make + ["allnoconfig"], os.path.join(dest, f"{n:02d}-config.log"),
                       "configure", env={**build_env(), "KCONFIG_ALLCONFIG": merged})
            run_logged(make + ["bzImage", "modules"], os.path.join(dest, f"{n:02d}-build.log"),
                       f"build with patches 1-{n}", env=build_env(), count_prefix="  CC")
            stale = [c for c in changed_c_files(os.path.join(cfg.patches, name))
                     if not _built_since(os.path.join(obj, c[:-2] + ".o"), started)]
            if stale:
                raise CommandError(f"bisect {n}/{len(names)}: {name} changes "
                                   f"{', '.join(stale)}, which the build with patches 1-{n} "
                                   "did not compile (not in the configuration?)")
            say(f"bisect {n}/{len(names)}: compiled "
                f"{', '.join(changed_c_files(os.path.join(cfg.patches, name))) or 'no .c file changed'}")
        done.append(name)
    return done


def _built_since(path: str, when: float) -> bool:
    try:
        return os.stat(path).st_mtime >= when - 1
    except OSError:
        return False


# What Kbuild prints (Makefile, target prepare) when the compiler's version text
# is not the kernel's: on another system (Debian 13's gcc-12 is 12.4, the
# kernel's 12.2) it says only that the system differs, so it is never charged
# to a student; Debian's kernel tree skips the check when asked
# (DEBIAN_KERNEL_NO_CC_VERSION_CHECK).
CC_MISMATCH = "warning: the compiler differs from the one used to build the kernel"


@dataclasses.dataclass(frozen=True)
class ModuleCompiler:
    """The C compiler module builds use, and what to tell about it."""
    cc: str             # a command name on PATH: gcc-12, gcc
    kernel: str         # CONFIG_CC_VERSION_TEXT of the lab kernel
    note: str           # "" when the compiler is the kernel's own, else why not


def _config_value(name: str, obj: str) -> str:
    try:
        with open(os.path.join(obj, ".config")) as f:
            for line in f:
                if line.startswith(name + "="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return ""


def _cc_major(cc: str) -> int:
    try:
        res = subprocess.run([cc, "-dumpversion"], capture_output=True, text=True, timeout=30)
        return int(res.stdout.strip().split(".")[0]) if res.returncode == 0 else 0
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


def module_compiler(obj: str) -> ModuleCompiler:
    """The compiler of the major version that built the lab kernel: gcc-N where the
    system has it (Debian 12 and 13, Ubuntu 22.04 and 24.04 all package gcc-12),
    else gcc if it is version N, else gcc anyway, with a note saying so: Kbuild
    then uses the options it detected for N, and a build may fail on the system's
    difference (never on the student's code alone)."""
    text = _config_value("CONFIG_CC_VERSION_TEXT", obj)
    try:
        major = int(_config_value("CONFIG_GCC_VERSION", obj)) // 10000
    except ValueError:
        major = 0
    if not major:
        return ModuleCompiler("gcc", text, "")
    if shutil.which(f"gcc-{major}"):
        return ModuleCompiler(f"gcc-{major}", text, "")
    have = _cc_major("gcc")
    if have == major:
        return ModuleCompiler("gcc", text, "")
    return ModuleCompiler("gcc", text, f"the lab kernel was built with gcc {major} ({text}); "
                          f"this system has no gcc-{major}, so modules are built with gcc "
                          f"{have or '?'} (install gcc-{major} to build with the kernel's "
                          f"compiler)")


def build_module(src_dir: str, out_dir: str, log: str, t: Tree) -> list[str]:
    """Build an out-of-tree module with Kbuild against the lab kernel (t).

    The sources are copied to out_dir first so that the source folder stays
    clean; returns the .ko files built.
    """
    if not os.path.exists(os.path.join(t.obj, "Module.symvers")):
        raise MissingError("the lab kernel is not built: run 'make kernel'")
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(src_dir, out_dir)
    cc = module_compiler(t.obj)
    run_logged(["make", "-C", t.obj, f"M={out_dir}", "W=1", f"CC={cc.cc}", "modules"], log,
               f"module {os.path.basename(src_dir)}",
               env={**build_env(), "DEBIAN_KERNEL_NO_CC_VERSION_CHECK": "1"})
    return sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir) if f.endswith(".ko"))


__all__ = ["build", "apply_series", "unpack", "series", "tree", "Tree", "PatchError",
           "ConfigError", "CommandError"]
