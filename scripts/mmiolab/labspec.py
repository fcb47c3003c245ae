"""Per-lab grading data: what a submission may contain, what the module may
import, the limits of a run and the graded tests with their points.

Each lab keeps this in ``labs/<lab>/lab.toml`` so that the grader is code and
the lab is data (the kunit tool keeps its per-arch QEMU settings the same
way): adding a lab, or changing its points, never touches the grader. The
file is validated strictly on load, unknown keys included, because a typo in
a grading table ("point = 40") must stop the instructor before a class is
graded, not after.

Schema (``schema = 1``)::

    schema        = 1
    name          = "doorbell"            # must equal the lab's folder name
    title         = "..."                 # one line, for reports
    module        = "ringdrv"             # kernel module name (C identifier)
    files         = ["ringdrv.c"]         # the exact names a student may submit
    symbols       = ["_printk", ...]      # undefined symbols the module may import;
                                          # an entry with '*' is a glob ("__x86_indirect_thunk_*")
    default_seeds = [1, 2, 3]             # PRNG seeds of the fabric for the race tests
    symbols_from  = "doorbell"            # optional: also allow that lab's symbols
    fixture_base  = "solution:ref"        # optional: what the wrong-fix fixtures and
                                          # correct variants patch: "starter" (the
                                          # default) or "solution:NAME"

    [limits]                              # all optional, defaults below
    build_timeout   = 120                 # seconds for the module build
    run_timeout     = 90                  # seconds for a whole guest run on the reference
                                          # machine (speed.py): scaled by this machine's
                                          # slowdown, the run's ceiling
    stall_timeout   = 60                  # seconds a run may make no progress (the
                                          # harness's heartbeat): then it is stuck, a hang
    max_slowdown    = 8                   # the most the limits are scaled by
    cpu_seconds     = 0                   # CPU time one submission of the reference solution
                                          # takes (build and guests), measured: calibrate's
                                          # estimate of its time (0: unknown)
    console_cap     = 1048576             # bytes of console kept; more is a flood
    max_file_bytes  = 1048576             # per submitted file
    max_members     = 500                 # entries of an archive submission
    max_total_bytes = 33554432            # declared bytes of all archive members

    [fabric]                              # the run's fabric, recorded in every report,
                                          # in the kernel's names (mmiosim.NAME=VALUE)
    profile   = "sn2"                     # qemu | pc | sn2
    locking   = "2004"                    # 2004 | 5.2
    clock     = "skip"                    # optional: real (the default) | skip: the
                                          # fabric's clock jumps ahead where a CPU would
                                          # spin waiting for it (patches/0017; less CPU)
    # any further key = number/string/bool: a boot parameter of the fabric

    [phrases]                             # optional: the harness's key=value measurements
    lost = "{} commands lost"             # in words, in this order, for a failing test
                                          # ("{}" is the value; only the keys the lab prints)

    [[labstats]]                          # optional: a labstats row under another fabric
    variant = "starter"                   # starter | solution:NAME | correct:NAME | fixture:NAME
    fabric  = { profile = "pc" }          # the lab's [fabric] with these on top

    [[tests]]                             # in report order
    name        = "race"                  # KTAP test name: [a-z][a-z0-9_]*
    points      = 40                      # >= 0
    visibility  = "visible"               # visible | hidden | after_due_date | after_published
    source      = "ktap"                  # ktap: the guest harness reports it;
                                          # host: the grader decides it (build, console scan)
    per_seed    = true                    # optional: repeated over the seeds
    description = "..."
    credit_by   = "flush"                 # optional, with credit: a pass earns the
    credit.mmiowb = { share = 1.0 }       # points times the share for the value the
    credit.none = { share = 0.0,          # harness reported for this key (a value
        why = "...", flag = "..." }       # not listed: nothing); why: words in the
                                          # test's output; flag: words for the
                                          # instructor's report only
    all_of      = ["race", "race_4cpu"]   # optional: decided by the grader from these
                                          # tests (source "derived"): passed only if
                                          # every one passed; not "visible" if any
                                          # part is not
    notice      = "..."                   # optional, on a derived test: a note for the
                                          # student's summary while the test is held

A reference solution is a patch to the starter, ``solutions/NAME.patch``
(``patch -p1``, no fuzz; what the fix is and why on its first lines, as the
fixtures' "Wrong fix (NAME): why"): LabSpec.solution_source(NAME) applies it
to a copy under build/, never in the lab's folder.

Hidden tests live apart, in ``labs/<lab>/hidden/`` (the grader runs them, the
student handout leaves the folder out): ``hidden/harness.sh`` is run in a
second guest, and ``hidden/hidden.toml`` says how::

    smp = 4                               # vCPUs of the hidden guest (2..8)
    [fabric]                              # overrides of lab.toml's [fabric]
    route_ns = "800,4000,2000,9500"
    [[tests]]                             # as in lab.toml; source is "hidden"
    name = "race_4cpu"
    ...
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
if sys.version_info >= (3, 11):
    import tomllib
else:                           # Python 3.10 (Ubuntu 22.04): the same parser, packaged
    import tomli as tomllib     # python3-tomli
from dataclasses import dataclass, field
from typing import Any, Iterable, NoReturn, cast

from . import ROOT, MmiolabError, sandbox, submission
from .config import Config

LABS_DIR = os.path.join(ROOT, "labs")
SCHEMA = 1
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
SOURCES = ("ktap", "host", "hidden", "derived")
PROFILES = ("qemu", "pc", "sn2")
LOCKINGS = ("2004", "5.2")
CLOCKS = ("real", "skip")
BUILD_FILES = ("Makefile", "makefile", "GNUmakefile", "Kbuild")

_TEST_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SYMBOL = re.compile(r"[A-Za-z_.][A-Za-z0-9_.*]*\Z")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")
_LAB_NAME = re.compile(r"[a-z][a-z0-9_-]*\Z")
_VARIANT = re.compile(r"starter\Z|(solution|correct|fixture):[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_BASE = re.compile(r"starter\Z|solution:[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


class LabSpecError(MmiolabError):
    """A lab.toml is missing, unreadable or does not follow the schema, or a
    lab's patch (a solution, a fixture) is missing or does not apply."""


@dataclass(frozen=True)
class Credit:
    """What a passing test earns when its harness reported `value` for the
    test's credit_by key: `share` of the points, `why` in its output, and
    `flag` (if any) in the instructor's report."""
    value: str
    share: float
    why: str = ""
    flag: str = ""


@dataclass(frozen=True)
class GradedTest:
    """One graded test: its KTAP name, its points and who may see it. A test
    with credit_by is scored by what its harness measured (lab.toml's credit
    table: the doorbell lab's cost test), not by its status alone."""
    name: str
    points: float
    visibility: str
    description: str
    source: str = "ktap"
    per_seed: bool = False
    credit_by: str = ""
    credit: tuple[Credit, ...] = ()
    all_of: tuple[str, ...] = ()    # source "derived": passed only if these all passed
    notice: str = ""                # said in the student's summary while the test is held

    def credit_for(self, values: dict[str, str]) -> Credit | None:
        """The credit row for what the harness reported (its key=value
        diagnostics), or None: the value is missing or not in the table."""
        value = values.get(self.credit_by)
        return next((c for c in self.credit if c.value == value), None)


@dataclass(frozen=True)
class Limits:
    """Bounds of one grading run, lab.toml's [limits]: the one source of the
    build's sandbox limits (build()) and the intake's caps (intake())."""
    build_timeout: float = 120.0
    run_timeout: float = 90.0
    stall_timeout: float = 60.0
    max_slowdown: float = 8.0
    cpu_seconds: float = 0.0
    console_cap: int = 1 << 20
    max_file_bytes: int = 1 << 20
    max_members: int = 500
    max_total_bytes: int = 32 << 20

    def build(self) -> sandbox.Limits:
        """The confined module build's limits: the sandbox's defaults, this lab's time."""
        return sandbox.Limits(timeout=self.build_timeout, cpu_seconds=int(self.build_timeout))

    def intake(self) -> submission.IntakeLimits:
        """The caps intake applies to this lab's submissions."""
        return submission.IntakeLimits(max_file_bytes=self.max_file_bytes,
                                       max_members=self.max_members,
                                       max_total_bytes=self.max_total_bytes)


def boot_words(params: dict[str, Any]) -> list[str]:
    """Kernel command-line words for fabric parameters (lab.toml's names are the kernel's)."""
    return [f"mmiosim.{key}={val}" for key, val in params.items()]


@dataclass(frozen=True)
class StatsRow:
    """A labstats row: one of the lab's variants under other fabric parameters."""
    variant: str
    fabric: dict[str, Any]

    @property
    def append(self) -> list[str]:
        return boot_words(self.fabric)


@dataclass(frozen=True)
class LabSpec:
    """The validated contents of one labs/<lab>/lab.toml."""
    name: str
    title: str
    module: str
    files: tuple[str, ...]
    symbols: frozenset[str]
    default_seeds: tuple[int, ...]
    tests: tuple[GradedTest, ...]
    limits: Limits = field(default_factory=Limits)
    fabric: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    fixture_base: str = "starter"   # starter | solution:NAME
    symbols_from: str = ""          # the lab whose allow-list this one borrows
    # The functions of the starter a fix (right or plausibly wrong) changes: a
    # submission that changes others is flagged for the instructor (objcheck.review).
    fix_functions: tuple[str, ...] = ()
    hidden_smp: int = 0             # vCPUs of the hidden tests' guest; 0: no hidden tests
    hidden_fabric: dict[str, Any] = field(default_factory=dict)   # lab.toml's, overridden
    phrases: dict[str, str] = field(default_factory=dict)         # diagnostic key -> "{} words"
    labstats: tuple[StatsRow, ...] = ()

    @property
    def dir(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    def out(self, cfg: Config) -> str:
        """Where the kit keeps what it builds for the lab (build/labs/LAB)."""
        return os.path.join(cfg.build, "labs", self.name)

    @property
    def harness(self) -> str:
        return os.path.join(self.dir, "tests", "harness.sh")

    @property
    def starter(self) -> str:
        return os.path.join(self.dir, "starter", self.files[0])

    @property
    def solutions(self) -> tuple[str, ...]:
        """The names of the reference solutions (solutions/NAME.patch), sorted;
        none in a handout."""
        d = os.path.join(self.dir, "solutions")
        names = os.listdir(d) if os.path.isdir(d) else []
        return tuple(sorted(n[:-len(".patch")] for n in names if n.endswith(".patch")))

    def solution_patch(self, name: str) -> str:
        return os.path.join(self.dir, "solutions", f"{name}.patch")

    def solution_source(self, name: str, cfg: Config) -> str:
        """Reference solution NAME as a file (files[0]): its patch applied to the
        starter, under build/labs/LAB/solutions/, in a folder named for the
        two files' digest (made once, then reused)."""
        patch = self.solution_patch(name)
        if not os.path.isfile(patch):
            raise LabSpecError(f"lab {self.name} has no solution {name!r} (no {patch})")
        digest = hashlib.sha256()
        for path in (self.starter, patch):
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
        folder = os.path.join(self.out(cfg), "solutions")
        done = os.path.join(folder, f"{name}-{digest.hexdigest()[:16]}")
        if not os.path.isfile(os.path.join(done, self.files[0])):
            os.makedirs(folder, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=folder)
            try:
                apply_patch(self.starter, patch, os.path.join(tmp, self.files[0]))
                os.chmod(tmp, 0o755)
                try:
                    os.rename(tmp, done)
                except OSError:     # made meanwhile by another process
                    if not os.path.isfile(os.path.join(done, self.files[0])):
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return os.path.join(done, self.files[0])

    def fixture_base_source(self, cfg: Config) -> str:
        """The file the lab's fixtures and correct variants patch (fixture_base)."""
        if self.fixture_base == "starter":
            return self.starter
        return self.solution_source(self.fixture_base.split(":", 1)[1], cfg)

    @property
    def per_seed_tests(self) -> tuple[GradedTest, ...]:
        return tuple(t for t in self.tests if t.per_seed)

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def ktap_tests(self) -> tuple[GradedTest, ...]:
        """The tests the guest harness must report, in plan order."""
        return tuple(t for t in self.tests if t.source == "ktap")

    @property
    def hidden_tests(self) -> tuple[GradedTest, ...]:
        """The tests hidden/harness.sh reports, in plan order."""
        return tuple(t for t in self.tests if t.source == "hidden")

    @property
    def hidden_harness(self) -> str:
        return os.path.join(self.dir, "hidden", "harness.sh")

    def test(self, name: str) -> GradedTest:
        for t in self.tests:
            if t.name == name:
                return t
        raise KeyError(f"lab {self.name} has no test {name!r}")

    def symbol_allowed(self, symbol: str) -> bool:
        if symbol in self.symbols:
            return True
        return any("*" in pat and fnmatch.fnmatchcase(symbol, pat) for pat in self.symbols)

    def forbidden_symbols(self, undefined: Iterable[str]) -> list[str]:
        """The module's undefined symbols that the allow-list does not cover, sorted.

        A student module that imports anything else (filp_open, kallsyms_lookup_name,
        the fabric's own controls) is reported by name instead of being run.
        """
        return sorted({s for s in undefined if not self.symbol_allowed(s)})


def undefined_symbols(nm_output: str) -> list[str]:
    """Symbol names from `nm -u` (or `nm` output filtered to 'U' lines) of a .ko.

    Kept here with the allow-list so that the check is testable without a toolchain.
    """
    names = []
    for line in nm_output.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            names.append(parts[1])
        elif len(parts) == 3 and parts[1] == "U":
            names.append(parts[2])
    return names


def apply_patch(base: str, patch: str, dest: str) -> None:
    """Write `base` with `patch` (-p1) applied to `dest`; no fuzz (-F0): a patch
    that no longer fits is an error that names it."""
    folder, name = os.path.split(dest)
    shutil.copy(base, dest)
    res = subprocess.run(["patch", "-s", "-F0", "-p1", "--no-backup-if-mismatch", "-i",
                          os.path.abspath(patch), name],
                         cwd=folder, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if res.returncode:
        raise LabSpecError(f"{_shown(patch)} does not apply to {_shown(base)} without "
                           f"fuzz (patch -F0): "
                           + " ".join((res.stdout + res.stderr).split())[:400])


def _shown(path: str) -> str:
    """A kit file by its path in the kit, any other by its own."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def lab_names(labs_dir: str = LABS_DIR) -> list[str]:
    """The labs that have a lab.toml, sorted."""
    try:
        entries = sorted(os.listdir(labs_dir))
    except OSError:
        return []
    return [e for e in entries if os.path.isfile(os.path.join(labs_dir, e, "lab.toml"))]


def load_lab(name: str, labs_dir: str = LABS_DIR) -> LabSpec:
    """Load labs/<name>/lab.toml; an unknown lab names the known ones."""
    if not _LAB_NAME.match(name or ""):
        raise LabSpecError(f"{name!r} is not a lab name")
    path = os.path.join(labs_dir, name, "lab.toml")
    if not os.path.isfile(path):
        known = ", ".join(lab_names(labs_dir)) or "none"
        raise LabSpecError(f"no lab {name!r} (no {path}); known labs: {known}")
    spec = load(path)
    if spec.name != name:
        raise LabSpecError(f"{path}: name = {spec.name!r} but the folder is {name!r}")
    return spec


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise LabSpecError(f"{path}: cannot read: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise LabSpecError(f"{path}: not valid TOML: {e}") from e


def load(path: str) -> LabSpec:
    """Read and validate one lab.toml."""
    data = _read_toml(path)
    spec = from_dict(data, path)
    hidden = os.path.join(os.path.dirname(os.path.abspath(path)), "hidden", "hidden.toml")
    return with_hidden(spec, hidden) if os.path.exists(hidden) else spec


def with_hidden(spec: LabSpec, path: str) -> LabSpec:
    """The lab with the hidden tests of hidden/hidden.toml added."""
    data = _read_toml(path)
    v = _Validator(path)
    v.keys(data, "", required={"tests"}, optional={"smp", "fabric"})
    smp = data.get("smp", 4)
    if type(smp) is not int or not 2 <= smp <= 8:
        v.fail("smp", f"must be an integer from 2 to 8, got {smp!r}")
    fabric = {**spec.fabric, **_fabric(v, data.get("fabric", {}))}
    tests = _tests(v, data["tests"], source="hidden")
    clash = {t.name for t in tests} & {t.name for t in spec.tests}
    if clash:
        v.fail("tests", f"names already used by lab.toml: {', '.join(sorted(clash))}")
    if not os.path.isfile(os.path.join(os.path.dirname(path), "harness.sh")):
        v.fail("tests", "hidden/harness.sh is missing")
    _check_derived(v, spec.tests + tests)
    return dataclasses.replace(spec, tests=spec.tests + tests, hidden_smp=smp,
                               hidden_fabric=fabric)


def from_dict(data: dict[str, Any], path: str = "<lab.toml>") -> LabSpec:
    """Validate parsed TOML; every error names the file and the key."""
    v = _Validator(path)
    v.keys(data, "", required={"schema", "name", "title", "module", "files", "symbols",
                               "default_seeds", "tests"},
           optional={"limits", "fabric", "symbols_from", "fixture_base", "fix_functions",
                     "phrases", "labstats"})
    if data["schema"] != SCHEMA:
        v.fail("schema", f"this grader reads schema {SCHEMA}, got {data['schema']!r}")
    name = v.string(data, "name", _LAB_NAME, "a lab name ([a-z][a-z0-9_-]*)")
    title = v.string(data, "title")
    module = v.string(data, "module", _C_IDENT, "a C identifier")
    files = v.string_list(data, "files")
    for i, f in enumerate(files):
        if not _FILE_NAME.match(f) or f in (".", "..") or f in BUILD_FILES:
            v.fail(f"files[{i}]", f"{f!r} must be a plain file name (no folders, not a "
                                  f"Makefile/Kbuild: the grader owns the build)")
    if len(set(files)) != len(files):
        v.fail("files", "names must be unique")
    symbols = v.string_list(data, "symbols")
    for i, s in enumerate(symbols):
        if not _SYMBOL.match(s):
            v.fail(f"symbols[{i}]", f"{s!r} is not a symbol name or glob")
    other = ""
    if "symbols_from" in data:
        other = v.string(data, "symbols_from", _LAB_NAME, "a lab name")
        other_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))),
                                  other, "lab.toml")
        if other == name or not os.path.isfile(other_path):
            v.fail("symbols_from", f"no other lab {other!r} next to this one")
        with open(other_path, "rb") as other_toml:
            if "symbols_from" in tomllib.load(other_toml):    # one level: no chains, no loops
                v.fail("symbols_from", f"lab {other!r} borrows its symbols too")
        symbols = symbols + list(load(other_path).symbols)
    fix_functions = v.string_list(data, "fix_functions") if "fix_functions" in data else []
    for i, f in enumerate(fix_functions):
        if not _C_IDENT.match(f):
            v.fail(f"fix_functions[{i}]", f"{f!r} is not a C identifier")
    fixture_base = data.get("fixture_base", "starter")
    old = re.match(r"solutions/([^/]+)/", fixture_base) if isinstance(fixture_base, str) else None
    if old:
        v.fail("fixture_base", f'solutions are patches to the starter now: write '
                               f'"solution:{old.group(1)}"')
    if not isinstance(fixture_base, str) or not _BASE.match(fixture_base):
        v.fail("fixture_base", f'must be "starter" or "solution:NAME" (solutions/NAME.patch), '
                               f"got {fixture_base!r}")
    seeds = data["default_seeds"]
    if (not isinstance(seeds, list) or not seeds
            or any(type(s) is not int or not 0 <= s < 1 << 64 for s in seeds)):
        v.fail("default_seeds", "must be a non-empty list of integers in [0, 2**64)")
    limits = _limits(v, data.get("limits", {}))
    fabric = _fabric(v, data.get("fabric", {}))
    tests = _tests(v, data["tests"])
    _check_derived(v, tests)
    phrases = _phrases(v, data.get("phrases", {}))
    rows = _labstats(v, data.get("labstats", []))
    return LabSpec(name=name, title=title, module=module, files=tuple(files),
                   symbols=frozenset(symbols), default_seeds=tuple(seeds), tests=tests,
                   limits=limits, fabric=fabric, path=path, fixture_base=fixture_base,
                   symbols_from=other, fix_functions=tuple(fix_functions), phrases=phrases,
                   labstats=rows)


class _Validator:
    """Small helpers that turn schema violations into one clear LabSpecError."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, key: str, why: str) -> NoReturn:
        raise LabSpecError(f"{self.path}: {key}: {why}")

    def keys(self, table: Any, where: str, required: set[str], optional: set[str]) -> None:
        if not isinstance(table, dict):
            self.fail(where or "top level", "must be a table")
        prefix = f"{where}." if where else ""
        for k in sorted(table.keys() - required - optional):   # first: a typo explains a gap
            self.fail(prefix + k, "unknown key (a typo?); known: "
                                  + ", ".join(sorted(required | optional)))
        for k in sorted(required - table.keys()):
            self.fail(prefix + k, "missing")

    def string(self, table: dict[str, Any], key: str, pattern: re.Pattern[str] | None = None,
               what: str = "", where: str = "") -> str:
        val = table[key]
        full = f"{where}.{key}" if where else key
        if not isinstance(val, str) or not val.strip():
            self.fail(full, f"must be a non-empty string, got {val!r}")
        if pattern is not None and not pattern.match(val):
            self.fail(full, f"must be {what}, got {val!r}")
        return val

    def string_list(self, table: dict[str, Any], key: str) -> list[str]:
        val = table[key]
        if not isinstance(val, list) or not val or not all(isinstance(s, str) for s in val):
            self.fail(key, "must be a non-empty list of strings")
        return val

    def number(self, table: dict[str, Any], key: str, where: str, integer: bool = False,
               minimum: float = 0, strict: bool = True) -> float:
        val = table[key]
        ok_type = type(val) is int if integer else type(val) in (int, float)
        if not ok_type or (val <= minimum if strict else val < minimum):
            kind = "an integer" if integer else "a number"
            rel = ">" if strict else ">="
            self.fail(f"{where}.{key}", f"must be {kind} {rel} {minimum}, got {val!r}")
        return cast(float, val)         # an int or a float, checked above


def _limits(v: _Validator, table: Any) -> Limits:
    ints = {"console_cap", "max_file_bytes", "max_members", "max_total_bytes"}
    floats = {"build_timeout", "run_timeout", "stall_timeout", "max_slowdown",
              "cpu_seconds"}
    v.keys(table, "limits", required=set(), optional=ints | floats)
    vals = {k: v.number(table, k, "limits", integer=k in ints) for k in table}
    # Each field's own type (mypy would take them all for floats).
    typed: dict[str, Any] = {k: (int(x) if k in ints else float(x)) for k, x in vals.items()}
    return Limits(**typed)


def _fabric(v: _Validator, table: Any, where: str = "fabric") -> dict[str, Any]:
    if not isinstance(table, dict):
        v.fail(where, "must be a table")
    out: dict[str, Any] = {}
    for k, val in table.items():
        if k == "semantics":        # the kit's old word for it
            v.fail(f"{where}.semantics", "is now called locking, the kernel's name "
                                         f"(mmiosim.locking): write locking = {val!r}")
        if not _C_IDENT.match(k):
            v.fail(f"{where}.{k}", "parameter names are C identifiers")
        if type(val) not in (str, int, float, bool):
            v.fail(f"{where}.{k}", f"must be a string, number or boolean, got {val!r}")
        out[k] = val
    if "profile" in out and out["profile"] not in PROFILES:
        v.fail(f"{where}.profile", f"must be one of {', '.join(PROFILES)}, got {out['profile']!r}")
    if "locking" in out and out["locking"] not in LOCKINGS:
        v.fail(f"{where}.locking",
               f"must be one of {', '.join(LOCKINGS)} (as a string), got {out['locking']!r}")
    if "clock" in out and out["clock"] not in CLOCKS:
        v.fail(f"{where}.clock", f"must be one of {', '.join(CLOCKS)}, got {out['clock']!r}")
    return out


def _phrases(v: _Validator, table: Any) -> dict[str, str]:
    """[phrases]: diagnostic key -> words with one "{}" for its value, in order."""
    if not isinstance(table, dict):
        v.fail("phrases", "must be a table")
    for k, words in table.items():
        if not _TEST_NAME.match(k):
            v.fail(f"phrases.{k}", "keys are the harness's diagnostic names ([a-z][a-z0-9_]*)")
        if (not isinstance(words, str) or words.count("{}") != 1
                or words.count("{") != 1 or words.count("}") != 1):
            v.fail(f"phrases.{k}", f'must be a string with one "{{}}" for the value, '
                                   f"got {words!r}")
    return dict(table)


def _labstats(v: _Validator, rows: Any) -> tuple[StatsRow, ...]:
    """[[labstats]]: a variant of the lab under other fabric parameters. Whether
    the variant exists is not checked here: a handout's lab has no solutions/
    (tests/test_labs.py checks the kit's)."""
    if not isinstance(rows, list):
        v.fail("labstats", "must be an array of tables ([[labstats]])")
    out = []
    for i, row in enumerate(rows):
        where = f"labstats[{i}]"
        v.keys(row, where, required={"variant", "fabric"}, optional=set())
        variant = v.string(row, "variant", _VARIANT,
                           "starter, solution:NAME, correct:NAME or fixture:NAME", where)
        fabric = _fabric(v, row["fabric"], f"{where}.fabric")
        if not fabric:
            v.fail(f"{where}.fabric", "is empty: the lab's own fabric has its rows already")
        out.append(StatsRow(variant, fabric))
    return tuple(out)


def _tests(v: _Validator, tests: Any, source: str = "") -> tuple[GradedTest, ...]:
    """[[tests]] of lab.toml, or of hidden/hidden.toml (source="hidden", fixed)."""
    if not isinstance(tests, list) or not tests:
        v.fail("tests", "must be a non-empty array of tables ([[tests]])")
    out = []
    seen: set[str] = set()
    for i, t in enumerate(tests):
        where = f"tests[{i}]"
        v.keys(t, where, required={"name", "points", "visibility", "description"},
               optional={"per_seed", "credit_by", "credit", "all_of", "notice"}
               | (set() if source else {"source"}))
        name = v.string(t, "name", _TEST_NAME, "a KTAP test name ([a-z][a-z0-9_]*)", where)
        if name in seen:
            v.fail(f"{where}.name", f"duplicate test name {name!r}")
        seen.add(name)
        points = v.number(t, "points", where, minimum=0, strict=False)
        vis = t["visibility"]
        if vis not in VISIBILITIES:
            v.fail(f"{where}.visibility", f"must be one of {', '.join(VISIBILITIES)}, got {vis!r}")
        kind = source or t.get("source", "ktap")
        if kind not in SOURCES or (not source and kind in ("hidden", "derived")):
            v.fail(f"{where}.source", f"must be ktap or host (hidden tests live in "
                                      f"hidden/hidden.toml; all_of makes a derived "
                                      f"test), got {kind!r}")
        all_of: list[str] = []
        if "all_of" in t:
            if "source" in t or t.get("per_seed") or "credit_by" in t:
                v.fail(f"{where}.all_of", "a derived test has no source, per_seed or credit "
                                          "of its own")
            all_of = v.string_list(t, "all_of")
            kind = "derived"
        elif "notice" in t:
            v.fail(f"{where}.notice", "only a derived test (all_of) has a notice")
        per_seed = t.get("per_seed", False)
        if type(per_seed) is not bool:
            v.fail(f"{where}.per_seed", f"must be true or false, got {per_seed!r}")
        credit_by, credit = _credit(v, t, where, kind)
        out.append(GradedTest(name=name, points=float(points), visibility=vis,
                              description=v.string(t, "description", where=where),
                              source=kind, per_seed=per_seed, credit_by=credit_by,
                              credit=credit, all_of=tuple(all_of),
                              notice=v.string(t, "notice", where=where) if "notice" in t
                              else ""))
    if sum(t.points for t in out) <= 0:
        v.fail("tests", "the points add up to 0")
    return tuple(out)


def _credit(v: _Validator, t: dict[str, Any], where: str,
            kind: str) -> tuple[str, tuple[Credit, ...]]:
    """A test's credit_by and credit table: both or neither, for a test a
    harness reports; each row a share in [0, 1] and optional words."""
    if "credit_by" not in t and "credit" not in t:
        return "", ()
    if "credit_by" not in t or "credit" not in t:
        v.fail(where, "credit_by and credit go together")
    if kind == "host":
        v.fail(f"{where}.credit_by", "the grader decides a host test: no harness measurement "
                                     "to credit")
    by = v.string(t, "credit_by", _TEST_NAME, "a diagnostic key ([a-z][a-z0-9_]*)", where)
    table = t["credit"]
    if not isinstance(table, dict) or not table:
        v.fail(f"{where}.credit", "must be a table: value = { share = ... }")
    rows = []
    for value, row in table.items():
        at = f"{where}.credit.{value}"
        v.keys(row, at, required={"share"}, optional={"why", "flag"})
        share = v.number(row, "share", at, minimum=0, strict=False)
        if share > 1:
            v.fail(f"{at}.share", f"must be at most 1 (a share of the points), got {share!r}")
        words = {k: v.string(row, k, where=at) for k in ("why", "flag") if k in row}
        rows.append(Credit(value, float(share), **words))
    return by, tuple(rows)


def _check_derived(v: _Validator, tests: tuple[GradedTest, ...]) -> None:
    """A derived test's parts are other tests of the lab, none derived; one
    with a part the student does not see at once is not seen at once either
    (its result would tell the hidden part's)."""
    by_name = {t.name: t for t in tests}
    for t in tests:
        for part in t.all_of:
            if part not in by_name or part == t.name:
                v.fail(f"tests.{t.name}.all_of", f"{part!r} is not another test of the lab")
            p = by_name[part]
            if p.source == "derived":
                v.fail(f"tests.{t.name}.all_of", f"{part!r} is derived itself")
            if t.visibility == "visible" and (p.visibility != "visible" or p.source == "hidden"):
                v.fail(f"tests.{t.name}.visibility", f"must not be visible: its part {part!r} "
                                                    f"is not")
