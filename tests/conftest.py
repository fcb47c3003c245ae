"""The suite under pytest: tests/run runs it, tests/pytest.ini holds the settings.

The test modules import from scripts/ and tests/. This file prints the lines
tests/run always printed, in place of pytest's own: what a test said (the
figures tests report on stderr) just before its line 'ok   test_ktap.
ParserTest.test_worst (0.0s)' (FAIL with the traceback, skip with the reason),
a failing unittest subTest as a FAIL line of its own, a line every 30 s
naming what still runs while output is held back, and at the end 'suite took
Ns' and the line CI reads: 'N passed, N failed' (', N skipped' if any).
--only PATTERN keeps the tests whose id matches *PATTERN* (tests/run -k).
Under xdist (tests/run -j N) the longest modules of the last whole run start
first.
"""

import fnmatch
import json
import os
import sys
import threading
import time
import traceback

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
sys.path.insert(0, HERE)

from kitcfg import BUILD  # noqa: E402

# Tests make their folders under build/, which a fresh clone does not have yet.
os.makedirs(BUILD, exist_ok=True)

DURATIONS = os.path.join(BUILD, "tests", "durations.json")
QUIET_TICK = 30.0
# With one of these pytest reports as it always does (its options need its reporter).
PYTEST_OWN = ("help", "collectonly", "showfixtures", "show_fixtures_per_test", "markers",
              "usepdb", "setupshow", "setuponly", "setupplan")


def unittest_id(nodeid: str) -> str:
    """test_ktap.py::ParserTest::test_worst is test_ktap.ParserTest.test_worst."""
    path, _, rest = nodeid.partition("::")
    parts = [os.path.basename(path).removesuffix(".py")]
    return ".".join(parts + rest.split("::") if rest else parts)


def module_of(nodeid: str) -> str:
    return os.path.basename(nodeid.partition("::")[0]).removesuffix(".py")


def load_durations() -> dict:
    try:
        with open(DURATIONS) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_durations(seen: dict) -> None:
    old = load_durations()
    old.update(seen)
    os.makedirs(os.path.dirname(DURATIONS), exist_ok=True)
    tmp = f"{DURATIONS}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(old, f, indent=1, sort_keys=True)
    os.replace(tmp, DURATIONS)


def pytest_addoption(parser):
    parser.addoption("--only", action="append", default=[], metavar="PATTERN",
                     help="only the tests whose id (test_ktap.ParserTest.test_worst) "
                          "matches *PATTERN*, a glob; repeatable (tests/run -k)")


def pytest_collection_modifyitems(config, items):
    patterns = config.getoption("only")
    if patterns:
        keep = [i for i in items
                if any(fnmatch.fnmatchcase(unittest_id(i.nodeid), f"*{p}*") for p in patterns)]
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
        items[:] = keep
    # unittest's order within a module: classes by name. Under xdist (every
    # worker reads the same file) the longest modules of the last run first.
    last = load_durations() if hasattr(config, "workerinput") else {}
    first: dict[str, int] = {}
    for i in items:
        first.setdefault(module_of(i.nodeid), len(first))
    items.sort(key=lambda i: (-last.get(module_of(i.nodeid), 1e6), first[module_of(i.nodeid)],
                              i.cls.__name__ if i.cls else ""))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failure's traceback as unittest printed it: from the tests' own code
    on, without unittest's frames."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        report.longrepr = _as_unittest(call.excinfo.value)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module that cannot be imported: pytest's words, as text (xdist adds
    none of its own to text)."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.longrepr = str(report.longrepr)


def _as_unittest(exc: BaseException) -> str:
    frames = [(f, n) for f, n in traceback.walk_tb(exc.__traceback__)
              if "__unittest" not in f.f_globals]
    ours = [i for i, (f, _) in enumerate(frames)
            if f.f_code.co_filename.startswith(HERE + os.sep)]
    shown = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    shown.stack = traceback.StackSummary.extract(frames[ours[0] if ours else 0:])
    return "".join(shown.format())


def _ours(config) -> bool:
    return not any(config.getoption(o, None) for o in PYTEST_OWN)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """pytest's reporter is never made (nor an xdist worker's), so xdist
    prints nothing either."""
    if _ours(config):
        config.pluginmanager.set_blocked("terminalreporter")


def pytest_configure(config):
    if _ours(config) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Lines(config), "mmiolab-lines")


def _own_stdout():
    """This process's stdout even while a test's output is captured (the tick)."""
    try:
        return os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    except (AttributeError, OSError, ValueError):
        return sys.stdout


class Lines:
    """The suite's lines and its counts."""

    def __init__(self, config):
        self.out = _own_stdout()
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "FAIL": 0, "skip": 0}
        self.failed: list[str] = []
        self.tests: dict[str, dict] = {}
        self.class_failed: dict[str, str] = {}
        self.crashed: set[str] = set()
        self.running: dict[str, float] = {}
        self.took: dict[str, float] = {}
        self.seconds: list[tuple[float, str]] = []
        self.slowest = config.getoption("durations")
        self.t0 = self.quiet_since = time.monotonic()
        # Module times are kept from runs of whole modules only.
        self.whole = not (config.getoption("only") or config.getoption("keyword")
                          or config.getoption("markexpr") or any("::" in a for a in config.args))
        self.done = threading.Event()
        if config.getoption("capture") != "no":
            threading.Thread(target=self._tick, daemon=True).start()

    def _say(self, text: str) -> None:
        for f in (sys.stdout, sys.stderr):      # what the test printed goes first
            f.flush()
        with self.lock:
            self.out.write(text)
            self.out.flush()
            self.quiet_since = time.monotonic()

    def _tick(self) -> None:
        while not self.done.wait(1.0):
            with self.lock:
                now = time.monotonic()
                if not self.running or now - self.quiet_since < QUIET_TICK:
                    continue
                busy = ", ".join(f"{unittest_id(n)} {int(now - t) // 60}m{int(now - t) % 60:02d}s"
                                 for n, t in self.running.items())
                self.out.write(f"     ... running: {busy}\n")
                self.out.flush()
                self.quiet_since = now

    def _emit(self, word, tid: str, seconds: float, detail: str = "", said: str = "") -> None:
        text = said
        if word:
            self.counts[word] += 1
            if word == "FAIL":
                self.failed.append(tid)
            text += f"{word:4} {tid} ({seconds:.1f}s)\n"
            self.seconds.append((seconds, tid))
        if detail:
            text += detail.rstrip("\n") + "\n"
        self._say(text)

    def pytest_collectreport(self, report):
        if report.failed:           # a module that cannot be imported
            self._emit("FAIL", unittest_id(report.nodeid), 0.0, str(report.longrepr))
        elif report.skipped:
            self._emit("skip", unittest_id(report.nodeid), 0.0, "     " + _reason(report))

    def pytest_runtest_logstart(self, nodeid, location):
        with self.lock:
            self.running[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report):
        t = self.tests.setdefault(report.nodeid, {"seconds": 0.0, "word": "ok", "detail": [],
                                                  "subtests_failed": False})
        if getattr(report, "context", None) is not None:     # a subTest (pytest-subtests)
            if report.failed:
                t["subtests_failed"] = True
                self._emit("FAIL", f"{unittest_id(report.nodeid)} {report.sub_test_description()}",
                           report.duration, str(report.longrepr))
            return
        if report.when not in ("setup", "call", "teardown"):
            # xdist: its worker died. (xdist 3.1's loadfile runs it again in
            # each new worker until too many died: one failure.)
            del self.tests[report.nodeid]
            with self.lock:
                self.running.pop(report.nodeid, None)
            first = report.nodeid not in self.crashed
            self.crashed.add(report.nodeid)
            self._emit("FAIL" if first else None, unittest_id(report.nodeid), 0.0,
                       str(report.longrepr))
            return
        t["seconds"] += report.duration
        if report.failed and report.when == "setup":
            # A class's setUpClass fails once, as under unittest, not once a test.
            cls = report.nodeid.rpartition("::")[0]
            if self.class_failed.get(cls) == str(report.longrepr):
                t["word"] = None
            self.class_failed[cls] = str(report.longrepr)
        if report.failed and t["word"]:
            t["word"] = "FAIL"
            t["detail"].append(str(report.longrepr))
        elif report.skipped and t["word"] == "ok":
            t["word"] = "skip"
            t["detail"].append("     " + _reason(report))
        if report.when != "teardown":
            return
        del self.tests[report.nodeid]
        with self.lock:
            self.running.pop(report.nodeid, None)
        mod = module_of(report.nodeid)
        self.took[mod] = round(self.took.get(mod, 0.0) + t["seconds"], 1)
        said = "".join(text for title, text in report.sections if title.startswith("Captured "))
        # As under unittest, a test whose subtests failed neither passed nor failed itself.
        word = None if t["word"] == "ok" and t["subtests_failed"] else t["word"]
        self._emit(word, unittest_id(report.nodeid), t["seconds"], "\n".join(t["detail"]), said)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.done.set()
        if self.whole and self.took:
            save_durations(self.took)
        passed, failed, skipped = self.counts["ok"], self.counts["FAIL"], self.counts["skip"]
        text = "\nfailed:\n  " + "\n  ".join(self.failed) + "\n" if self.failed else ""
        if self.slowest is not None:            # pytest's --durations=N (0: all)
            ranked = sorted(self.seconds, reverse=True)[:self.slowest or None]
            text += "\nslowest:\n" + "".join(f"  {s:7.1f}s {tid}\n" for s, tid in ranked)
        text += f"\nsuite took {time.monotonic() - self.t0:.0f}s\n"
        text += f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")
        self._say(text + "\n")
        if session.exitstatus == 0 and (failed or not passed):
            session.exitstatus = 1


def _reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, (tuple, list)) else str(longrepr)
    return reason.removeprefix("Skipped: ")
