"""Parse the guest harness's KTAP into a tree, trusting only the harness's lines.

KTAP is Documentation/dev-tools/ktap.rst: version 1 ("KTAP version 1", nested
tests begin with their own version line) and the older KUnit flavour ("TAP
version 14", nested tests begin with "# Subtest: name"). The tree mirrors the
kernel's tools/testing/kunit/kunit_parser.py (a Test with a status, a log and
subtests), and follows its rule that a missing result is a crash, never a pass.

Trust. A student's module runs in the same guest and can print anything,
including perfect KTAP. So the harness prefixes each line it prints with a
per-run nonce (``<nonce> <ktap line>``) on its own channel (a second serial
port); only lines that carry the nonce are parsed, every other line is
counted as untrusted and otherwise ignored. Console timestamps
(``[   12.345678] ``) are stripped first, so the same rule works if the
harness lines went through the kernel log.

Grading consequences, all conservative:

- no trusted output at all: the root is CRASHED (never an empty pass);
- a plan promising N tests with fewer results: the missing ones are CRASHED;
- ``expect()`` maps the lab's test names to results; a name that never
  reported is CRASHED; a parent that says ok over a failed subtest fails.

The module also scans a console log for kernel trouble (oops, panic, WARNING,
lockdep, hung task) and cuts a log excerpt around it for the report.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Iterator, Literal, overload

from . import MmiolabError


class Status(Enum):
    """Outcome of one test. CRASHED: it never reported (crash, hang, reboot, cut output)."""
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"
    CRASHED = "crashed"

    @property
    def ok(self) -> bool:
        return self is Status.PASS


_SEVERITY = {Status.PASS: 0, Status.SKIP: 1, Status.FAIL: 2, Status.ERROR: 3, Status.CRASHED: 4}


def worst(statuses: Iterable[Status]) -> Status:
    """The most serious status of a group (CRASHED > ERROR > FAIL > SKIP > PASS)."""
    return max(statuses, key=_SEVERITY.__getitem__, default=Status.CRASHED)


class KtapError(MmiolabError):
    """Bad arguments to the parser (an unusable nonce); never raised for bad input text."""


@dataclass
class Test:
    """One KTAP test: a leaf result, or a block with its own plan and subtests."""
    name: str = ""
    status: Status = Status.CRASHED
    number: int | None = None
    directive: str = ""            # SKIP, TODO, XFAIL, TIMEOUT or ERROR, from '# DIRECTIVE ...'
    reason: str = ""               # what follows '#' on the result line (minus the directive)
    log: list[str] = field(default_factory=list)   # diagnostic and unknown lines before it
    subtests: list["Test"] = field(default_factory=list)
    expected_count: int | None = None
    errors: list[str] = field(default_factory=list)

    def walk(self) -> Iterator["Test"]:
        yield self
        for t in self.subtests:
            yield from t.walk()

    def find(self, name: str) -> "Test | None":
        """The first test of that name: direct subtests first, then deeper."""
        for t in self.subtests:
            if t.name == name:
                return t
        for t in self.subtests:
            hit = t.find(name)
            if hit is not None:
                return hit
        return None

    def leaves(self) -> list["Test"]:
        """The test cases (tests without subtests) of this subtree."""
        return [t for t in self.walk() if not t.subtests]

    def diagnostics(self) -> list[str]:
        """The log lines of this test, without the leading '# '."""
        return [line[2:] if line.startswith("# ") else line.lstrip("#") for line in self.log]

    def values(self) -> dict[str, str]:
        """key=value pairs from this test's diagnostics and result line (last one wins).

        The harness reports its measurements this way, e.g.
        '# race: seed=3 lost=0 duplicated=2 stale_doorbells=5'.
        """
        out: dict[str, str] = {}
        for text in self.diagnostics() + [self.reason]:
            for k, v in key_values(text):
                out[k] = v
        return out

    def text(self, indent: str = "") -> str:
        """A readable rendering of the subtree (status, name, diagnostics)."""
        lines = []
        for d in self.diagnostics():
            lines.append(f"{indent}  # {d}")
        tail = f"  # {self.directive} {self.reason}".rstrip() if (self.directive or self.reason) \
            else ""
        lines.append(f"{indent}{self.status.name:7} {self.name}{tail}")
        for e in self.errors:
            lines.append(f"{indent}  ! {e}")
        sub = [t.text(indent + "    ") for t in self.subtests]
        return "\n".join(sub + lines)


@dataclass
class ParseResult:
    """The tree, with what the trust filter and the parser saw on the way."""
    root: Test
    version: str = ""                 # "KTAP version 1", "TAP version 14", or ""
    trusted_lines: int = 0
    untrusted_lines: int = 0
    untrusted_sample: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def status(self) -> Status:
        return self.root.status

    def expect(self, names: Iterable[str]) -> dict[str, Test]:
        """Results for the tests a lab grades, by name; see module-level expect()."""
        return expect(self, names)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (the grader parses guest output in a bounded child)."""
        return {"root": _test_dict(self.root), "version": self.version,
                "trusted_lines": self.trusted_lines, "untrusted_lines": self.untrusted_lines,
                "untrusted_sample": list(self.untrusted_sample), "errors": list(self.errors)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ParseResult":
        return cls(root=_test_from(d["root"]), version=d["version"],
                   trusted_lines=d["trusted_lines"], untrusted_lines=d["untrusted_lines"],
                   untrusted_sample=list(d["untrusted_sample"]), errors=list(d["errors"]))


def _test_dict(t: Test) -> dict[str, Any]:
    return {"name": t.name, "status": t.status.value, "number": t.number,
            "directive": t.directive, "reason": t.reason, "log": list(t.log),
            "subtests": [_test_dict(c) for c in t.subtests], "expected_count": t.expected_count,
            "errors": list(t.errors)}


def _test_from(d: dict[str, Any]) -> Test:
    return Test(name=d["name"], status=Status(d["status"]), number=d["number"],
                directive=d["directive"], reason=d["reason"], log=list(d["log"]),
                subtests=[_test_from(c) for c in d["subtests"]],
                expected_count=d["expected_count"], errors=list(d["errors"]))


# ---------------------------------------------------------------------------- lines

# Every pattern applied to guest text is anchored and has no two unbounded
# quantifiers that can trade characters (no backtracking blow-up); result and
# subtest lines are read with str methods (_result, _subtest). Lines are cut
# at MAX_LINE first, so no pattern ever sees a longer one.
_TIMESTAMP = re.compile(r"^\s*\[\s*\d+\.\d+\](?:\[\s*[TC]\d+\])? ?")
_VERSION = re.compile(r"^(\s*)(K?TAP) version (\d+)\s*$")
_PLAN = re.compile(r"^(\s*)1\.\.(\d+)\s*(?:#.*)?$")
_DIRECTIVES = ("SKIP", "TODO", "XFAIL", "TIMEOUT", "ERROR")
_NONCE = re.compile(r"[A-Za-z0-9_-]{8,128}\Z")
# Where the kernel's parser stops reading KTAP off a console (kunit_parser.KTAP_END).
_KTAP_END = re.compile(r"\s*(List of all partitions:|Kernel panic - not syncing: VFS:|"
                       r"reboot: System halted)")
_SAMPLE = 20
MAX_MISSING = 1000      # tests a plan promised that get one CRASHED entry each
MAX_DEPTH = 16          # nesting beyond this is diagnostics: untrusted text cannot recurse us dry
#: The longest line of guest output any parser reads (a harness line is under 200
#: characters). A longer harness line is replaced by CUT_LINE: it reports nothing.
MAX_LINE = 4096
CUT_LINE = "# mmiolab: a line of {} characters was not read (over the {}-character cap)"
_KEY_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_KEY_REST = _KEY_FIRST | frozenset("0123456789.")


def key_values(text: str) -> list[tuple[str, str]]:
    """The key=value pairs of a line, in linear time: in each word, the first '='
    with a key before it ([A-Za-z_][A-Za-z0-9_.]*) and a value after it (the rest
    of the word), as re.findall(r"([A-Za-z_][A-Za-z0-9_.]*)=(\\S+)") would find
    them, without its quadratic worst case on a long word."""
    out = []
    for word in text.split():
        start = -1
        for j, ch in enumerate(word):
            if ch == "=":
                if start >= 0 and j + 1 < len(word):
                    out.append((word[start:j], word[j + 1:]))
                    break
                start = -1
            elif ch in _KEY_REST:
                if start < 0 and ch in _KEY_FIRST:
                    start = j
            else:
                start = -1
    return out


class _Result:
    """A parsed result line, read like the match of the old pattern
    ^(\\s*)(ok|not ok) (\\d+)(?: - | -$| |$)([^#]*?)\\s*(?:#\\s*(.*?))?\\s*$:
    group(1) indent, 2 ok/not ok, 3 number, 4 name, 5 directive text or None."""

    def __init__(self, *groups: str | None):
        self._groups = groups

    @overload
    def group(self, i: Literal[1, 2, 3, 4]) -> str: ...

    @overload
    def group(self, i: Literal[5]) -> str | None: ...

    def group(self, i: int) -> str | None:
        return self._groups[i - 1]


def _result(line: str) -> _Result | None:
    body = line.lstrip()
    indent = line[:len(line) - len(body)]
    if body.startswith("ok "):
        word, rest = "ok", body[3:]
    elif body.startswith("not ok "):
        word, rest = "not ok", body[7:]
    else:
        return None
    n = 0
    while n < len(rest) and rest[n] in "0123456789":
        n += 1
    if not n:
        return None
    number, rest = rest[:n], rest[n:]
    if rest.startswith(" - "):
        rest = rest[3:]
    elif rest == " -":
        rest = ""
    elif rest.startswith(" "):
        rest = rest[1:]
    elif rest:
        return None
    name, hash_, tail = rest.partition("#")
    return _Result(indent, word, number, name.rstrip(), tail.strip() if hash_ else None)


def _subtest(line: str) -> str | None:
    """The name of a '# Subtest: name' line, or None."""
    body = line.lstrip()
    return body[11:].rstrip() if body.startswith("# Subtest: ") else None


def make_nonce() -> str:
    """A fresh per-run nonce for the harness (128 random bits, hex)."""
    return secrets.token_hex(16)


def strip_timestamp(line: str) -> str:
    """Remove a printk timestamp ('[   12.345678] ', with an optional caller id)."""
    return _TIMESTAMP.sub("", line, count=1)


def _split(text: str | Iterable[str]) -> Iterable[str]:
    """Lines as a serial port delivers them: only '\n' ends a line (str.splitlines
    would also split on \x1c, \x85, U+2028... that a module could print)."""
    return text.split("\n") if isinstance(text, str) else text


def _clean(line: str) -> str:
    """A line without its timestamp and carriage returns, cut after MAX_LINE
    characters (callers that must know check the raw length: _too_long)."""
    return strip_timestamp(line[:MAX_LINE + 64].rstrip("\r\n").replace("\r", ""))[:MAX_LINE]


def _too_long(raw: str) -> bool:
    return len(raw) > MAX_LINE + 1 and len(raw.rstrip("\r\n")) > MAX_LINE


def trusted_lines(text: str | Iterable[str], nonce: str) -> tuple[list[str], int, list[str]]:
    """(KTAP lines carrying the nonce, count of other lines, a sample of them).

    A harness line is exactly '<nonce> <payload>' (or just '<nonce>' for an empty
    line) once the timestamp is gone. The nonce must be the whole first word, so
    a module that prints '<nonce>x ...' or guesses a prefix gains nothing.
    """
    if not _NONCE.match(nonce or ""):
        raise KtapError("nonce must be 8-128 characters of [A-Za-z0-9_-]")
    lines = _split(text)
    good: list[str] = []
    bad = 0
    sample: list[str] = []
    head = nonce + " "
    for raw in lines:
        line = _clean(raw)
        if line.startswith(head) and _too_long(raw):
            good.append(CUT_LINE.format(len(raw), MAX_LINE))
        elif line.startswith(head):
            good.append(line[len(head):])
        elif line == nonce:
            good.append("")
        elif line.strip():
            bad += 1
            if len(sample) < _SAMPLE:
                sample.append(line[:200])
    return good, bad, sample


# ---------------------------------------------------------------------------- parser

class _Lines:
    def __init__(self, lines: list[str]):
        self.lines = lines
        self.i = 0

    def peek(self) -> str | None:
        return self.lines[self.i] if self.i < len(self.lines) else None

    def pop(self) -> str:
        line = self.lines[self.i]
        self.i += 1
        return line

    def eof(self) -> bool:
        return self.i >= len(self.lines)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_structural(line: str) -> bool:
    return bool(_VERSION.match(line) or _subtest(line) is not None or _result(line))


def _diagnostics(s: _Lines) -> list[str]:
    out = []
    while not s.eof() and not _is_structural(s.peek() or ""):
        line = s.pop()
        if line.strip():
            out.append(line.strip())
    return out


def _apply_result(t: Test, m: _Result) -> None:
    """Fill a test from its result line. A directive it does not know falls back to
    ok / not ok, as ktap.rst asks; ERROR and TIMEOUT never pass."""
    ok = m.group(2) == "ok"
    t.number = int(m.group(3))
    name = m.group(4).strip()
    if name and t.name and name != t.name:
        t.errors.append(f"result line names {name!r} but the subtest header said {t.name!r}")
    t.name = t.name or name
    tail = (m.group(5) or "").strip()
    word = tail.split(" ", 1)[0].upper() if tail else ""
    if word in _DIRECTIVES:
        t.directive = word
        t.reason = tail[len(word):].strip()
    else:
        t.reason = tail
    if t.directive == "SKIP":
        t.status = Status.SKIP
    elif t.directive == "ERROR":
        t.status = Status.ERROR
    elif t.directive == "TIMEOUT":
        t.status = Status.FAIL
    else:
        t.status = Status.PASS if ok else Status.FAIL


def _parse_block(s: _Lines, t: Test, indent: int, nested: bool, depth: int = 0) -> None:
    """Parse the subtests of t until its plan is met, its own result line comes
    (less indented, or named like t when there is no plan), or the text ends."""
    num = 1
    while True:
        pre = _diagnostics(s)
        line = s.peek()
        if line is None:
            t.log.extend(pre)
            break
        planned_done = t.expected_count is not None and num > t.expected_count
        rm = _result(line)
        if nested and rm:
            closes = _indent(line) < indent or planned_done or (
                t.expected_count is None and t.name and rm.group(4).strip() == t.name)
            if closes:          # the diagnostics just read belong to t's own result
                t.log.extend(pre)
                break
        if nested and planned_done:
            t.log.extend(pre)
            break
        if rm:
            s.pop()
            child = Test(log=pre)
            _apply_result(child, rm)
        elif depth >= MAX_DEPTH:
            t.log.extend(pre + [s.pop().strip()])
            if "nesting" not in " ".join(t.errors):
                t.errors.append(f"tests nested deeper than {MAX_DEPTH}: read as diagnostics")
            continue
        else:
            child = _parse_nested(s, pre, depth + 1)
        if child.number is not None and child.number != num:
            t.errors.append(f"expected test number {num}, found {child.number}")
        if t.expected_count is not None and num > t.expected_count:
            t.errors.append(f"result {num} ({child.name!r}) beyond the plan 1..{t.expected_count}")
        t.subtests.append(child)
        num += 1
    _fill_missing(t)


def _parse_nested(s: _Lines, pre: list[str], depth: int) -> Test:
    t = Test(log=list(pre))
    first = s.pop()
    indent = _indent(first)
    if _VERSION.match(first):
        sm = _subtest(s.peek() or "")
        if sm is not None:
            s.pop()
            t.name = sm
    else:
        t.name = _subtest(first) or ""
    pm = _PLAN.match(s.peek() or "")
    if pm:
        s.pop()
        t.expected_count = int(pm.group(2))
    _parse_block(s, t, indent, nested=True, depth=depth)
    t.log.extend(_diagnostics(s))
    rm = _result(s.peek() or "")
    if rm and _indent(s.peek() or "") <= indent:
        s.pop()
        _apply_result(t, rm)
    else:
        t.status = Status.CRASHED
        t.errors.append("no result line: the output ended inside this test")
    _bubble(t)
    return t


def _fill_missing(t: Test) -> None:
    """Tests promised by the plan that never reported are CRASHED."""
    if t.expected_count is None:
        return
    last = min(t.expected_count, len(t.subtests) + MAX_MISSING)
    for n in range(len(t.subtests) + 1, last + 1):
        t.subtests.append(Test(name="", status=Status.CRASHED, number=n,
                               errors=[f"test {n} of {t.expected_count} never reported"]))
    if last < t.expected_count:     # a plan of 10^9 tests is not 10^9 objects
        t.subtests.append(Test(name="", status=Status.CRASHED, number=last + 1, errors=[
            f"tests {last + 1}-{t.expected_count} of {t.expected_count} never reported"]))


def _bubble(t: Test) -> None:
    """A parent is no better than its worst subtest (skips aside)."""
    if not t.subtests:
        return
    w = worst(x.status for x in t.subtests)
    if w is Status.CRASHED:
        t.status = Status.CRASHED
    elif t.status is Status.PASS and w in (Status.FAIL, Status.ERROR):
        t.status = Status.FAIL
        t.errors.append("reported ok, but a subtest did not pass")


def _parse_lines(lines: list[str], result: ParseResult) -> None:
    s = _Lines(lines)
    root = result.root
    while not s.eof() and not _VERSION.match(s.peek() or ""):
        line = s.pop().strip()
        if line:
            root.log.append(line)
    if s.eof():
        root.status = Status.CRASHED
        root.errors.append("no KTAP version line: the harness never started reporting")
        return
    vm = _VERSION.match(s.pop())
    assert vm is not None
    result.version = f"{vm.group(2)} version {vm.group(3)}"
    if (vm.group(2), vm.group(3)) not in (("KTAP", "1"), ("TAP", "13"), ("TAP", "14")):
        root.errors.append(f"unexpected {result.version}")
    pm = _PLAN.match(s.peek() or "")
    if pm:
        s.pop()
        root.expected_count = int(pm.group(2))
    else:
        root.errors.append("no plan line after the version line")
    _parse_block(s, root, 0, nested=False)
    if not root.subtests:
        root.status = Status.CRASHED
        root.errors.append("no test reported a result")
        return
    root.status = worst(t.status for t in root.subtests)
    if root.status is Status.SKIP and any(t.status is Status.PASS for t in root.subtests):
        root.status = Status.PASS


def parse(text: str | Iterable[str], nonce: str | None = None) -> ParseResult:
    """Parse harness output into a tree.

    With a nonce (grading), only '<nonce> ...' lines count. Without one (a student's
    self-check, or kernel KTAP), the KTAP starts at the first version line, like
    kunit.py parse, and ends where kunit's parser would (a VFS panic, "reboot:
    System halted"); lines before it count as untrusted.
    """
    result = ParseResult(root=Test(name="main"))
    if nonce is not None:
        lines, result.untrusted_lines, result.untrusted_sample = trusted_lines(text, nonce)
        result.trusted_lines = len(lines)
    else:
        raw = _split(text)
        lines = []
        started = False
        for r in raw:
            line = CUT_LINE.format(len(r), MAX_LINE) if _too_long(r) else _clean(r)
            if not started and _VERSION.match(line):
                started = True
            if started and _KTAP_END.match(line):
                break
            if started:
                lines.append(line)
            elif line.strip():
                result.untrusted_lines += 1
                if len(result.untrusted_sample) < _SAMPLE:
                    result.untrusted_sample.append(line[:200])
        result.trusted_lines = len(lines)
    if not lines:
        result.root.errors.append("no output from the harness")
        result.errors.append("no output from the harness")
        return result
    _parse_lines(lines, result)
    for t in result.root.walk():
        result.errors.extend(f"{t.name or '#' + str(t.number)}: {e}" for e in t.errors)
    return result


def expect(result: ParseResult, names: Iterable[str]) -> dict[str, Test]:
    """The top-level result for each graded name. A name with no result is CRASHED
    (it never reported); a name reported twice keeps its worst result."""
    out: dict[str, Test] = {}
    for name in names:
        hits = [t for t in result.root.subtests if t.name == name]
        if not hits:
            why = ("the harness produced no trusted output" if not result.trusted_lines
                   else "no result: the run ended (crash, hang or reboot) before this test "
                        "reported")
            out[name] = Test(name=name, status=Status.CRASHED, errors=[why])
            continue
        w = max(hits, key=lambda t: _SEVERITY[t.status])
        if len(hits) > 1:
            w.errors.append(f"reported {len(hits)} times; the worst result counts")
        out[name] = w
    return out


# ---------------------------------------------------------------------------- console

@dataclass(frozen=True)
class ConsoleEvent:
    """A line of the console that says the kernel is unhappy."""
    kind: str       # panic | oops | bug | warning | lockdep | hung | softlockup | rcu | ...
    line_no: int    # 0-based, in the console text
    text: str


# A pattern, or (first, then): a line with `first` and `then` after it (the
# linear form of 'first.*then', which backtracks on a line full of `first`).
_CONSOLE_PATTERNS: list[tuple[str, "re.Pattern[str] | tuple[str, str]"]] = [
    ("panic", re.compile(r"Kernel panic - not syncing")),
    ("oops", re.compile(r"\bOops\b|general protection fault|BUG: unable to handle")),
    ("bug", re.compile(r"kernel BUG at|\bBUG: (?!unable to handle)|list_(add|del) corruption")),
    ("lockdep", re.compile(r"possible circular locking dependency|possible recursive locking|"
                           r"inconsistent lock state|INFO: trying to register non-static key|"
                           r"suspicious RCU usage|possible irq lock inversion|"
                           r"WARNING: bad unlock balance|lock held when returning")),
    ("hung", ("INFO: task ", " blocked for more than")),
    ("softlockup", re.compile(r"watchdog: BUG: soft lockup")),
    ("softlockup", ("NMI watchdog: ", "hard LOCKUP")),
    ("rcu", re.compile(r"rcu: INFO: rcu_\w+ (self-)?detected stall")),
    ("warning", re.compile(r"WARNING: CPU: \d+ PID: \d+|------------\[ cut here \]------------"
                           r"|WARNING: at ")),
    ("sanitizer", re.compile(r"\b(UBSAN|KASAN|KFENCE|KCSAN): ")),
]


def _seen(pat: "re.Pattern[str] | tuple[str, str]", line: str) -> bool:
    if isinstance(pat, tuple):
        at = line.find(pat[0])
        return at >= 0 and line.find(pat[1], at + len(pat[0])) >= 0
    return pat.search(line) is not None


def scan_console(text: str) -> list[ConsoleEvent]:
    """Oops, panic, BUG, WARNING, lockdep and hung-task reports in a console log.

    A student module can print these words too; that only hurts its own grade,
    which is the safe direction.
    """
    events = []
    for i, raw in enumerate(text.split("\n")):
        line = _clean(raw)          # at most MAX_LINE characters
        for kind, pat in _CONSOLE_PATTERNS:
            if _seen(pat, line):
                if kind == "bug" and "soft lockup" in line:
                    continue
                events.append(ConsoleEvent(kind, i, line.strip()[:300]))
                break
    return events


def console_excerpt(text: str, events: list[ConsoleEvent] | None = None, before: int = 5,
                    after: int = 40, tail: int = 30, max_chars: int = 8000) -> str:
    """The part of a console log a person should read: from a few lines before the
    first kernel complaint to the end of its report; else the last lines."""
    lines = text.split("\n")
    if events is None:
        events = scan_console(text)
    if events:
        first = min(e.line_no for e in events)
        chunk = lines[max(0, first - before):first + after]
        head = f"[console lines {max(0, first - before) + 1}-{min(len(lines), first + after)}]"
    else:
        chunk = lines[-tail:]
        head = f"[last {len(chunk)} console lines]"
    body = "\n".join(l.rstrip("\r") for l in chunk)
    if len(body) > max_chars:
        body = body[:max_chars] + "\n[... cut]"
    return f"{head}\n{body}" if chunk else ""
