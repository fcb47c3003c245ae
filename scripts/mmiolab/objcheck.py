"""Check a student's module (.ko) before it runs: what it imports and what its
code does, as far as an object file can say.

Refused (the module never runs):

- an undefined symbol the lab does not allow, strong or weak; a weak undefined
  symbol is refused whatever its name (the loader resolves it like any other,
  and `#pragma weak` is how one hides an import from a check that reads only
  'U' lines);
- an absolute symbol other than a file name (``.set fn, 0xffffffff81000000``
  makes a relocation land on a fixed address);
- a section both writable and executable, or more code than a lab driver
  could need (MAX_CODE_BYTES);
- instructions a driver never needs: port I/O, MSR and control/debug
  register access, descriptor-table loads and stores, software interrupts,
  hlt, system calls and returns, cache and TLB invalidation, hypercalls and
  virtualization instructions, monitor/mwait;
- a call or jump to a constant address: an indirect branch through a fixed
  memory address, a constant in the range of kernel text and modules, or a
  direct branch into the middle of an instruction (hidden code).

Flagged for the instructor (the module runs; the report says it):

- indirect calls or jumps through a register or computed memory address
  (legitimate for callbacks, but also how a driver calls what it found);
- in the source: inline assembly, __builtin_return_address or
  __builtin_frame_address (a kernel pointer to compute from), .incbin, and
  #include of a path.

This is a filter, not a proof: code that computes its targets at run time
from a kernel pointer it holds is beyond it (see the threat model).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Iterable, NamedTuple

from . import MmiolabError

MAX_CODE_BYTES = 256 << 10         # the doorbell driver has about 2 KiB of code
MAX_MODULE_BYTES = 8 << 20

SHN_UNDEF, SHN_ABS, SHN_COMMON = 0, 0xFFF1, 0xFFF2
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
STT_SECTION, STT_FILE = 3, 4
SHT_SYMTAB = 2
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4

# Kernel text, modules, fixmap: [__START_KERNEL_map, the vsyscall page).
KERNEL_LOW, KERNEL_HIGH = 0xFFFFFFFF80000000, 0xFFFFFFFFFF000000


class ElfError(MmiolabError):
    """Not an x86-64 relocatable object we can read."""


class Symbol(NamedTuple):
    name: str
    bind: int
    type: int
    shndx: int


class Section(NamedTuple):
    name: str
    type: int
    flags: int
    size: int


@dataclass
class Findings:
    imports: list[str] = field(default_factory=list)     # refused: what it links to
    refused: list[str] = field(default_factory=list)     # refused: what its code holds
    flags: list[str] = field(default_factory=list)       # for the instructor to read

    @property
    def verdict(self) -> str:
        """'' when the module may run; else the grader's verdict code."""
        return "forbidden-symbols" if self.imports else "forbidden-code" if self.refused else ""

    @property
    def why(self) -> str:
        return "; ".join(self.imports + self.refused)


# ---------------------------------------------------------------------------- ELF

def read_elf(data: bytes) -> tuple[list[Section], list[Symbol]]:
    """Sections and symbols of an ELF64 little-endian x86-64 relocatable object."""
    try:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ElfError("not a 64-bit little-endian ELF file")
        e_type, e_machine = struct.unpack_from("<HH", data, 16)
        if e_type != 1 or e_machine != 62:
            raise ElfError("not an x86-64 relocatable object (a kernel module)")
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        if shentsize != 64 or shnum == 0 or shnum > 4096 or shstrndx >= shnum:
            raise ElfError("unusual section header table")
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]

        def blob(sh: tuple[int, ...]) -> bytes:
            off, size = sh[4], sh[5]
            if sh[1] == 8:                      # SHT_NOBITS
                return b""
            if off + size > len(data):
                raise ElfError("a section runs past the end of the file")
            return data[off:off + size]

        shstr = blob(raw[shstrndx])

        def name_at(table: bytes, off: int) -> str:
            end = table.find(b"\0", off)
            if off >= len(table) or end < 0:
                raise ElfError("a name runs past its string table")
            return table[off:end].decode("utf-8", "backslashreplace")

        sections = [Section(name_at(shstr, sh[0]), sh[1], sh[2], sh[5]) for sh in raw]
        symbols: list[Symbol] = []
        for sh in raw:
            if sh[1] != SHT_SYMTAB:
                continue
            if sh[6] >= shnum or sh[9] != 24:
                raise ElfError("unusual symbol table")
            table, strtab = blob(sh), blob(raw[sh[6]])
            for i in range(len(table) // 24):
                st_name, st_info, _other, st_shndx, _value, _size = struct.unpack_from(
                    "<IBBHQQ", table, 24 * i)
                symbols.append(Symbol(name_at(strtab, st_name), st_info >> 4, st_info & 0xF,
                                      st_shndx))
        return sections, symbols
    except (struct.error, IndexError) as e:
        raise ElfError(f"truncated or malformed ELF ({e})") from e


def undefined(symbols: Iterable[Symbol]) -> list[tuple[str, bool]]:
    """(name, weak) of every undefined symbol, strong and weak."""
    return [(s.name, s.bind == STB_WEAK) for s in symbols
            if s.shndx == SHN_UNDEF and s.name]


def check_elf(data: bytes, allowed: Callable[[str], bool]) -> Findings:
    """Imports, absolute symbols, section flags and code size; `allowed(name)` is the
    lab's allow-list (labspec.LabSpec.symbol_allowed)."""
    f = Findings()
    if len(data) > MAX_MODULE_BYTES:
        f.refused.append(f"the module is {len(data)} bytes, over {MAX_MODULE_BYTES}")
        return f
    try:
        sections, symbols = read_elf(data)
    except ElfError as e:
        f.refused.append(f"the module is not a readable object file: {e}")
        return f
    und = undefined(symbols)
    weak = sorted({n for n, w in und if w})
    forbidden = sorted({n for n, _ in und if not allowed(n)})
    if forbidden:
        f.imports.append("imports kernel symbols this lab does not allow: " + ", ".join(forbidden))
    if weak:
        f.imports.append("weak undefined symbols (a weak import is still an import, and "
                         "is refused): " + ", ".join(weak))
    absolute = sorted({s.name for s in symbols if s.shndx == SHN_ABS and s.type != STT_FILE
                       and s.name})
    if absolute:
        f.imports.append("absolute symbols (fixed addresses): " + ", ".join(absolute))
    code = 0
    for sec in sections:
        if sec.flags & SHF_EXECINSTR and sec.flags & SHF_WRITE:
            f.refused.append(f"section {sec.name} is both writable and executable")
        if sec.flags & SHF_EXECINSTR:
            code += sec.size
    if code > MAX_CODE_BYTES:
        f.refused.append(f"{code} bytes of code, over {MAX_CODE_BYTES}: not a lab driver")
    return f


# ---------------------------------------------------------------------------- code

# Mnemonics (AT&T, as objdump prints them) a driver never needs.
_FORBIDDEN = [
    (r"(in|out)[bwl]?|(ins|outs)[bwld]?", "port I/O"),
    (r"rdmsr|wrmsr|wrmsrns|rdmsrlist|wrmsrlist", "MSR access"),
    (r"l[gi]dtq?|ll?dt|ltr|lmsw|clts|s[gi]dtq?|sldt|str|smsw", "descriptor tables or the "
     "machine status word"),
    (r"int|int1|icebp|into", "a software interrupt"),
    (r"hlt", "hlt"),
    (r"syscall|sysenter|sysexit[lq]?|sysret[lq]?|iret[wlq]?|swapgs|uiret|senduipi",
     "a system call, return or stack switch"),
    (r"invd|wbinvd|wbnoinvd|invlpg[a-z]*|invpcid", "cache or TLB invalidation"),
    (r"vmcall|vmmcall|vmfunc|vmlaunch|vmresume|vmxon|vmxoff|vmptrld|vmptrst|vmread|vmwrite|"
     r"vmclear|vmrun|vmload|vmsave|vmgexit|stgi|clgi|skinit|getsec|encl[suv]|pconfig|seamcall|"
     r"seamops|seamret|tdcall", "a hypercall or virtualization instruction"),
    (r"l(?:jmp|call|ret)[wlq]?", "a far call, jump or return"),
    (r"monitorx?|mwaitx?|umonitor|umwait|tpause", "monitor/mwait"),
    (r"xsetbv|wr[fg]sbase|wrpkru|rsm", "a privileged state change"),
]
_FORBIDDEN_RE = [(re.compile(rf"(?:{p})\Z"), why) for p, why in _FORBIDDEN]
_PREFIXES = {"rep", "repz", "repnz", "repe", "repne", "lock", "notrack", "bnd", "data16",
             "data32", "addr32", "addr16", "cs", "ds", "es", "fs", "gs", "ss", "xacquire",
             "xrelease", "rex", "rex.w", "rex.r", "rex.x", "rex.b"}
_INSN = re.compile(r"^\s*([0-9a-f]+):\t(.*)$")
_RELOC_ON_LINE = re.compile(r"[0-9a-f]+: (R_X86_64_\w+)\t(\S+)")
_SECTION = re.compile(r"^Disassembly of section (.*):$")
_CONST = re.compile(r"(?<![<\w])\$?(0x[0-9a-f]+)")
_BRANCH = re.compile(r"(?:call|jmp|j[a-z]{1,3}|loop[a-z]*|jrcxz|jecxz|xbegin)[lqw]?\Z")


class Insn(NamedTuple):
    section: str
    addr: int
    mnemonic: str
    operands: str
    reloc: str          # the relocation applied inside it ("" if none): "TYPE target"


def parse_objdump(text: str) -> list[Insn]:
    """Instructions of `objdump -d -r -w --no-show-raw-insn`: with -w a relocation
    follows its instruction on the same line ("\tOFFSET: R_X86_64_TYPE\tTARGET");
    each instruction keeps the (first) relocation applied inside it."""
    out: list[Insn] = []
    section = ""
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            section = m.group(1)
            continue
        m = _INSN.match(line)
        if not m:
            continue
        body, _, rest = m.group(2).partition("\t")
        r = _RELOC_ON_LINE.search(rest)
        reloc = f"{r.group(1)} {r.group(2)}" if r else ""
        words = body.split("#")[0].split()
        while words and words[0] in _PREFIXES:
            words.pop(0)
        mnem = words[0] if words else ""
        out.append(Insn(section, int(m.group(1), 16), mnem, " ".join(words[1:]), reloc))
    return out


def check_code(insns: list[Insn]) -> Findings:
    f = Findings()
    starts: dict[str, set[int]] = {}
    for ins in insns:
        starts.setdefault(ins.section, set()).add(ins.addr)
    bad: dict[str, list[str]] = {}
    indirect: list[str] = []
    prev = ""

    def hit(why: str, ins: Insn) -> None:
        bad.setdefault(why, []).append(f"{ins.mnemonic} at {ins.section}+{ins.addr:#x}")

    for ins in insns:
        m, ops = ins.mnemonic, ins.operands
        if m == "(bad)":
            hit("bytes that are not instructions, in executable code", ins)
        elif m == "int3" and prev not in ("ret", "retq", "jmp"):
            hit("a software interrupt", ins)      # int3 only as straight-line padding
        elif m == "mov" and re.search(r"%(cr|db|dr)\d", ops):
            hit("control or debug register access", ins)
        else:
            for rx, why in _FORBIDDEN_RE:
                if rx.match(m):
                    hit(why, ins)
                    break
        if not ins.reloc:
            for c in _CONST.findall(ops.split("<")[0]):
                if KERNEL_LOW <= int(c, 16) < KERNEL_HIGH:
                    hit("a constant kernel address (KASLR moves the kernel; a driver has no "
                        "use for one)", ins)
                    break
        if _BRANCH.match(m):
            if ops.startswith("*"):
                table = m.startswith("jmp") and ins.reloc and re.search(r"\(,%\w+,8\)", ops)
                if not ins.reloc and re.fullmatch(r"\*(?:%\w+:)?0x[0-9a-f]+(\(,%\w+,\d\))?",
                                                  ops):
                    hit("an indirect branch through a fixed address", ins)
                elif not table:                    # a switch's jump table is fine
                    indirect.append(f"{m} {ops} at {ins.section}+{ins.addr:#x}")
            elif not ins.reloc:
                t = re.match(r"([0-9a-f]+)\b", ops)
                if t and int(t.group(1), 16) not in starts.get(ins.section, ()):
                    hit("a branch into the middle of an instruction (hidden code)", ins)
            else:
                # call/jmp sym-0x4 lands on sym; a section of the module plus an
                # offset must land on one of its instructions
                r = re.match(r"R_X86_64_(?:PLT32|PC32) (.+?)([+-]0x[0-9a-f]+)?\Z", ins.reloc)
                if r:
                    target = int(r.group(2) or "0", 16) + 4
                    if r.group(1) in starts:
                        if target not in starts[r.group(1)]:
                            hit("a branch into the middle of an instruction (hidden code)", ins)
                    elif target:
                        hit("a branch into the middle of a function", ins)
        prev = m
    for why, where in bad.items():
        more = f" and {len(where) - 3} more" if len(where) > 3 else ""
        f.refused.append(f"{why}: {', '.join(where[:3])}{more}")
    if indirect:
        more = f" and {len(indirect) - 3} more" if len(indirect) > 3 else ""
        f.flags.append(f"{len(indirect)} indirect calls or jumps ({', '.join(indirect[:3])}"
                       f"{more})")
    return f


# ---------------------------------------------------------------------------- source

# Every pattern that reads a submission's text is linear: a blank is [ \t],
# never \s, wherever a match may start at each line (with re.M, ^\s*# let
# every line start of 1 MiB of newlines scan to the end: 104 s for 150 KB).
_SOURCE_FLAGS = [
    (re.compile(r"\b(?:asm|__asm__|__asm)\b"), "inline assembly"),
    (re.compile(r"__builtin_(?:return|frame)_address"), "__builtin_return_address or "
     "__builtin_frame_address"),
    (re.compile(r"\.incbin\b"), ".incbin"),
    (re.compile(r"^[ \t]*#[ \t]*include[ \t]*[\"<][ \t]*(?:/|\.\.)", re.M), "#include of a path "
     "outside the kernel's headers"),
    (re.compile(r"^[ \t]*#[ \t]*include[ \t]+[^\"<\s]", re.M), "#include of a macro"),
]
_PASTE = re.compile(r"##")


def source_flags(text: str) -> list[str]:
    """What in a source deserves a look (a hint: macros can hide any of it)."""
    out = [f"the source uses {what}" for rx, what in _SOURCE_FLAGS if rx.search(text)]
    if _PASTE.search(_code_only(text)):
        out.append("the source uses token pasting (##), which spells names no pattern reads")
    return out


# ---------------------------------------------------------------------------- preprocessor

# What the review reads is what the compiler sees: code under a conditional
# the compiler drops is dropped (issue 33: a brace pair under a never-defined
# #ifdef moved lines into a fix function). A condition is decided from the
# file's own #define and #undef, the compiler's and Kbuild's predefined
# macros, the lab kernel's configuration (autoconf.h) and, for any other
# name, whether the kernel's headers define it anywhere (KernelMacros): a
# name none of them defines is undefined, as it is to cpp. A condition on a
# name the headers do define (perhaps only under their own conditions), or on
# a reserved name (__*) the compiler may predefine, is not decided: both
# branches are read, and braces that do not balance inside such a branch are
# flagged, since they are what moves code between functions.

#: Defined for every module build: gcc's predefines and Kbuild's -D flags
#: that a driver might test (value None: defined, value not an integer).
_PREDEFINED: dict[str, int | None] = {
    "__KERNEL__": 1, "MODULE": 1, "__x86_64__": 1, "__x86_64": 1, "__linux__": 1,
    "__GNUC__": None, "__STDC__": 1, "__LP64__": 1, "_LP64": 1, "__OPTIMIZE__": 1,
    "KBUILD_MODNAME": None, "KBUILD_BASENAME": None, "__CHAR_BIT__": 8,
}
_IS_CONFIG = {"IS_ENABLED": ("y", "m"), "IS_BUILTIN": ("y",), "IS_MODULE": ("m",),
              "IS_REACHABLE": ("y", "m")}


@dataclass
class KernelMacros:
    """The lab kernel's macros, as far as a conditional needs them: its
    configuration (autoconf.h: CONFIG_FOO -> "y", "m" or the value) and the
    name of every macro its headers #define anywhere."""
    config: dict[str, str] = field(default_factory=dict)
    defined: frozenset[str] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "defined": sorted(self.defined)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelMacros":
        return cls(dict(d["config"]), frozenset(d["defined"]))


_DEFINE_LINE = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.M)
_AUTOCONF = re.compile(r"^#define (CONFIG_\w+) (.*)$", re.M)


def kernel_macros(roots: Iterable[str], autoconf: str) -> KernelMacros:
    """Scan the kernel's header folders (src/include, arch/x86/include, and the
    build's generated ones) and autoconf.h; about a second, once per grader."""
    import os
    names: set[str] = set()
    for root in roots:
        for folder, _dirs, files in os.walk(root):
            for fn in files:
                if fn.endswith(".h"):
                    try:
                        with open(os.path.join(folder, fn), "rb") as f:
                            names.update(m.decode() for m in _DEFINE_LINE.findall(f.read()))
                    except OSError:
                        pass
    config: dict[str, str] = {}
    with open(autoconf, encoding="utf-8", errors="replace") as f:
        for name, val in _AUTOCONF.findall(f.read()):
            if name.endswith("_MODULE") and val == "1" and name[:-7] not in config:
                config[name[:-7]] = "m"
            elif val == "1" and name + "_MODULE" not in config:
                config.setdefault(name, "y")
            else:
                config[name] = val
    return KernelMacros(config, frozenset(names))


_PP_TOKEN = re.compile(r"[ \t]*(?:(0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*|([A-Za-z_]\w*)|"
                       r"(&&|\|\||==|!=|<=|>=|<<|>>|[-+*/%<>!~&|^()?:,]))")
_BINARY = {"*": 10, "/": 10, "%": 10, "+": 9, "-": 9, "<<": 8, ">>": 8, "<": 7, ">": 7,
           "<=": 7, ">=": 7, "==": 6, "!=": 6, "&": 5, "^": 4, "|": 3, "&&": 2, "||": 1}
_MAX_PP_TOKENS, _MAX_PP_DEPTH = 512, 32


class _Undecided(Exception):
    """A conditional the review cannot evaluate."""


class _Conditions:
    """The state of the file's macros at a point, and #if expressions under it:
    True, False, or None (undecided)."""

    def __init__(self, kernel: KernelMacros | None):
        self.kernel = kernel
        self.defs: dict[str, str | None] = {}      # the file's: body, None if function-like
        self.undefs: set[str] = set()

    def define(self, name: str, body: str | None) -> None:
        self.defs[name] = body
        self.undefs.discard(name)

    def undef(self, name: str) -> None:
        self.defs.pop(name, None)
        self.undefs.add(name)

    def is_defined(self, name: str) -> bool | None:
        if name in self.defs:
            return True
        if name in self.undefs:
            return False
        if name in _PREDEFINED or name == "defined":
            return True
        k = self.kernel
        if k is None:
            return None
        if name.startswith("CONFIG_"):
            return name in k.config
        if name in k.defined or name.startswith("__"):
            return None
        return False

    def value(self, name: str, depth: int = 0) -> int | None:
        """A name's value in #if: 0 if undefined, None if not known."""
        d = self.is_defined(name)
        if d is False:
            return 0
        if d is None or depth > 8:
            return None
        if name in self.defs:
            body = (self.defs[name] or "").strip()
            while body.startswith("(") and body.endswith(")"):
                body = body[1:-1].strip()
            m = re.fullmatch(r"(0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*", body)
            if m:
                return int(m.group(1), 0)
            if re.fullmatch(r"[A-Za-z_]\w*", body):
                return self.value(body, depth + 1)
            return None
        if name in _PREDEFINED:
            return _PREDEFINED[name]
        if name.startswith("CONFIG_") and self.kernel is not None:
            v = self.kernel.config[name]
            if v in ("y", "m"):
                return 1
            try:
                return int(v, 0)
            except ValueError:
                return None
        return None

    def evaluate(self, expr: str) -> bool | None:
        toks: list[str] = []
        pos = 0
        expr = expr.rstrip()
        while pos < len(expr):
            m = _PP_TOKEN.match(expr, pos)
            if not m or len(toks) >= _MAX_PP_TOKENS:
                return None
            toks.append(m.group(1) or m.group(2) or m.group(3))
            pos = m.end()
        try:
            val, at = self._expr(toks, 0, 0, 0)
        except (_Undecided, IndexError, ValueError):
            return None
        return None if val is None or at != len(toks) else bool(val)

    def _expr(self, t: list[str], i: int, min_prec: int, depth: int
              ) -> tuple[int | None, int]:
        """An expression from t[i] of operators binding tighter than min_prec:
        (value, None if not known; the index after it). Precedence climbing."""
        if depth > _MAX_PP_DEPTH:
            raise _Undecided("nesting")
        left, i = self._unary(t, i, depth)
        while i < len(t):
            op = t[i]
            if op == "?":
                if min_prec > 0:
                    break
                a, i = self._expr(t, i + 1, 0, depth + 1)
                if t[i] != ":":
                    raise _Undecided("?:")
                b, i = self._expr(t, i + 1, 0, depth + 1)
                left = (a if left else b) if left is not None else (a if a == b else None)
                continue
            prec = _BINARY.get(op)
            if prec is None or prec < min_prec:
                break
            right, i = self._expr(t, i + 1, prec + 1, depth + 1)
            if op == "&&":      # a side known false decides, the other unknown or not
                left = 0 if 0 in (left, right) else None if None in (left, right) else 1
            elif op == "||":
                known = [v for v in (left, right) if v is not None]
                left = 1 if any(known) else None if len(known) < 2 else 0
            elif left is None or right is None:
                left = None
            elif op in ("/", "%") and right == 0:
                raise _Undecided("division by zero")
            else:
                x, y = left, right
                ops: dict[str, Callable[[], int]] = {
                    "*": lambda: x * y, "/": lambda: int(x / y), "%": lambda: x % y,
                    "+": lambda: x + y, "-": lambda: x - y,
                    "<<": lambda: x << min(max(y, 0), 64),
                    ">>": lambda: x >> min(max(y, 0), 64), "<": lambda: int(x < y),
                    ">": lambda: int(x > y), "<=": lambda: int(x <= y),
                    ">=": lambda: int(x >= y), "==": lambda: int(x == y),
                    "!=": lambda: int(x != y), "&": lambda: x & y, "^": lambda: x ^ y,
                    "|": lambda: x | y}
                left = ops[op]()
        return left, i

    def _unary(self, t: list[str], i: int, depth: int) -> tuple[int | None, int]:
        tok = t[i]
        if tok in ("!", "-", "+", "~"):
            if depth > _MAX_PP_DEPTH:
                raise _Undecided("nesting")
            v, i = self._unary(t, i + 1, depth + 1)
            if v is None:
                return None, i
            return {"!": int(not v), "-": -v, "+": v, "~": ~v}[tok], i
        if tok == "(":
            v, i = self._expr(t, i + 1, 0, depth + 1)
            if t[i] != ")":
                raise _Undecided("(")
            return v, i + 1
        if tok == "defined":
            if t[i + 1] == "(":
                name, i = t[i + 2], i + 4
                if t[i - 1] != ")":
                    raise _Undecided("defined(")
            else:
                name, i = t[i + 1], i + 2
            d = self.is_defined(name)
            return (None if d is None else int(d)), i
        if tok[0].isdigit():
            return int(tok, 0), i + 1
        if tok[0].isalpha() or tok[0] == "_":
            if i + 1 < len(t) and t[i + 1] == "(":
                if tok in _IS_CONFIG and t[i + 3] == ")" and tok not in self.defs:
                    name = t[i + 2]
                    d = self.is_defined(name)
                    if d is None or (d and not name.startswith("CONFIG_")):
                        return None, i + 4
                    setting = self.kernel.config.get(name) if self.kernel else None
                    return int(setting in _IS_CONFIG[tok]), i + 4
                # A function-like macro: unknown, its arguments skipped.
                depth_p, j = 0, i + 1
                while j < len(t):
                    depth_p += {"(": 1, ")": -1}.get(t[j], 0)
                    j += 1
                    if depth_p == 0:
                        break
                return None, j
            return self.value(tok), i + 1
        raise _Undecided(tok)


_DIRECTIVE = re.compile(r"[ \t]*#[ \t]*(\w*)[ \t]*(.*)\Z", re.S)
_DEFINE = re.compile(r"([A-Za-z_]\w*)(\()?(.*)\Z", re.S)


def live_code(code: str, kernel: KernelMacros | None = None
              ) -> tuple[str, list[str], dict[str, str | None]]:
    """Comment-free code (_code_only) as the compiler reads it: lines in a
    branch the preprocessor drops blanked (newlines kept), with what deserves
    a flag (unbalanced braces in a macro or in a branch the review cannot
    decide) and the file's macros at its end (name -> body, None if
    function-like). One pass over the lines."""
    lines = code.split("\n")
    cond = _Conditions(kernel)
    flags: list[str] = []
    # One frame per open #if: [this branch (True/False/None), a branch taken,
    # an earlier branch undecided, brace balance of this branch, its line].
    stack: list[list[Any]] = []
    i, n = 0, len(lines)

    def active() -> bool | None:
        state: bool | None = True
        for f in stack:
            if f[0] is False:
                return False
            if f[0] is None:
                state = None
        return state

    def close_branch(f: list[Any]) -> None:
        if f[0] is None and f[3] != 0:
            flags.append(f"braces that do not balance (line {f[4]}) in a branch of a "
                         f"preprocessor conditional the review cannot evaluate: they move "
                         f"code between functions")

    while i < n:
        ln = lines[i]
        m = _DIRECTIVE.match(ln)
        if not m:
            state = active()
            if state is False:
                lines[i] = ""
            elif state is None:
                delta = ln.count("{") - ln.count("}")
                for f in stack:
                    if f[0] is None:
                        f[3] += delta
            i += 1
            continue
        first = i
        text = ln
        while text.endswith("\\") and i + 1 < n:        # a continued directive
            i += 1
            text = text[:-1] + " " + lines[i]
        i += 1
        whole = _DIRECTIVE.match(text)
        word, rest = m.group(1), whole.group(2) if whole else ""
        state = active()
        c: bool | None
        if word in ("if", "ifdef", "ifndef"):
            if state is False:
                stack.append([False, True, False, 0, first + 1])
                continue
            if word == "if":
                c = cond.evaluate(rest)
            else:
                nm = re.match(r"[A-Za-z_]\w*", rest)
                c = cond.is_defined(nm.group(0)) if nm else None
                if word == "ifndef" and c is not None:
                    c = not c
            stack.append([c, c is True, c is None, 0, first + 1])
        elif word in ("elif", "else") and stack:
            f = stack.pop()
            close_branch(f)
            outer = active()            # the branch's surroundings, not the branch
            stack.append(f)
            if f[1] or outer is False:
                c = False
            else:
                c = True if word == "else" else cond.evaluate(rest)
                if f[2] and c is not False:
                    c = None
            f[0], f[1], f[2], f[3], f[4] = c, f[1] or c is True, f[2] or c is None, 0, first + 1
        elif word == "endif" and stack:
            close_branch(stack.pop())
        elif state is False:
            pass
        elif word == "define":
            dm = _DEFINE.match(rest)
            if dm:
                body = dm.group(3)
                if dm.group(2):
                    body = body.split(")", 1)[1] if ")" in body else ""
                if body.count("{") != body.count("}") or body.count("(") != body.count(")"):
                    flags.append(f"a macro with unbalanced braces or parentheses: {dm.group(1)} "
                                 "(it moves code between functions)")
                cond.define(dm.group(1), None if dm.group(2) else body)
        elif word == "undef":
            name = re.match(r"[A-Za-z_]\w*", rest)
            if name:
                cond.undef(name.group(0))
    for f in stack:
        close_branch(f)
    return "\n".join(lines), sorted(set(flags)), cond.defs


# ---------------------------------------------------------------------------- review

# What a driver reaching into kernel memory looks like in its source (issue 24),
# looked for only in the lines a submission adds or changes against the starter.
# Every pattern is literal words or a run of blanks between literals: linear on
# any line.
_WALKING = [
    (re.compile(r"\b(?:PAGE_OFFSET|page_offset_base|__va|__pa|phys_to_virt|virt_to_phys|"
                r"virt_to_page|pfn_to_page|page_to_pfn|page_to_virt|page_address|"
                r"pfn_to_kaddr|max_pfn|high_memory|vmemmap_base|vmalloc_base|"
                r"__START_KERNEL_map|phys_base|PAGE_MASK|__PAGE_OFFSET)\b"),
     "direct-map or page arithmetic"),
    (re.compile(r"\bcurrent[ \t]*->[ \t]*(?:fs|mm|active_mm|files|cred|real_parent|parent|"
                r"group_leader|tasks|nsproxy)\b|\b(?:init_task|init_mm|for_each_process|"
                r"find_vpid|pid_task|get_task_mm|mm_struct|fs_struct|files_struct|"
                r"address_space|i_mapping|f_mapping|d_inode|find_get_page|"
                r"swapper_pg_dir|pgd_offset|p4d_offset|pud_offset|pmd_offset|"
                r"pte_offset_kernel|lookup_address|kallsyms_lookup_name)\b"),
     "current->fs, current->mm or other kernel structures a driver does not need"),
    (re.compile(r"\*[ \t]*\([ \t]*(?:const[ \t]+)?(?:volatile[ \t]+)?(?:unsigned[ \t]+)?"
                r"(?:long|int|char|short|u8|u16|u32|u64|void|uintptr_t|size_t)[ \t]*\*+[ \t]*\)"
                r"|\b0x[fF]{6}[0-9a-fA-F]{4,}|\b(?:memmem|strnstr|memchr)\b"
                # a byte pointer made from an address and moved: (u8 *)&sym + n
                r"|\([ \t]*(?:const[ \t]+)?(?:volatile[ \t]+)?(?:unsigned[ \t]+|signed[ \t]+)?"
                r"(?:char|u8|s8|void|u16|u32|u64|int|long)[ \t]*\*[ \t]*\)[ \t]*\(?[ \t]*"
                r"(?:&|[A-Za-z_]\w*[ \t]*\)?[ \t]*(?:[+\[]|-(?!>)))"),
     "raw reads through casts, pointers made from a symbol's address and moved, or "
     "kernel-address constants (memory scanning)"),
]
# Integer casts of pointers (an address to compute with): not in a print's
# arguments, where a (u64) cast is how a value meets its format.
_INT_CAST = (re.compile(r"\([ \t]*(?:unsigned[ \t]+long|uintptr_t|u64|long|size_t|phys_addr_t)"
                        r"[ \t]*\)"),
             "integer casts of pointers (memory scanning)")
_ADDRESS = "the address of a symbol the file never declares (the kernel's)"
# User-copy helpers in every spelling the kernel exports or its headers define
# (_copy_from_user, __copy_from_user_inatomic, raw_copy_*, copy_*_nofault,
# __get_user_nocheck_8, strncpy_from_user...): any identifier with one of these
# in it, flagged when the submission uses it more often than the starter does
# (moving the starter's own copies to a helper is no new use).
_USER_COPY = re.compile(r"copy_(?:from|to|in)_user|(?:get|put|clear)_user|copy_user|"
                        r"_nofault|access_ok|user_(?:read_|write_)?access_begin|user_pages|"
                        r"strn(?:cpy|len)_(?:from_)?user|memdup_user|strndup_user|"
                        r"(?:from|to)_user_ptr|_from_user|_to_user")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_ADDRESS_OF = re.compile(r"&[ \t]*([A-Za-z_]\w*)\b(?![ \t]*(?:->|\.|\[|\())")
# (?<!\w): a match starts only at an identifier's start (else each position
# inside a long identifier would scan to its end again: quadratic).
_CALL = re.compile(r"(?<!\w)([A-Za-z_]\w*)[ \t]*\(")
_PRINT = re.compile(r"(?:pr_\w+|printk|no_printk|trace_printk|dev_(?:emerg|alert|crit|err|warn|"
                    r"notice|info|dbg|printk)\w*|netdev_\w+)\Z")
# What a change outside the fix may call and still be an ordinary refactor
# (a print, a lookup through container_of, a size...): a call to anything
# else there is flagged; the file's own functions are read where they are.
_BENIGN_CALLS = frozenset("""
if for while switch return sizeof typeof __typeof__ _Static_assert static_assert alignof
offsetof defined container_of container_of_const dev_name pr_fmt ARRAY_SIZE min max min_t
max_t clamp clamp_t likely unlikely READ_ONCE IS_ERR PTR_ERR ERR_PTR IS_ERR_OR_NULL WARN_ON
WARN_ON_ONCE WARN WARN_ONCE BUG_ON platform_get_drvdata dev_get_drvdata to_platform_device
lower_32_bits upper_32_bits BIT GENMASK cpu_to_le16 cpu_to_le32 cpu_to_le64 le16_to_cpu
le32_to_cpu le64_to_cpu smp_processor_id raw_smp_processor_id num_online_cpus jiffies_to_msecs
msecs_to_jiffies time_after time_before ktime_get ktime_get_ns ktime_sub ktime_to_ns
""".split())
_FILE_SCOPE_LINKS = re.compile(r"\bextern\b|__attribute__|\b__section\b|\b__used\b|"
                               r"\b__visible\b|_initcall\b|\bmodule_init\b|\bEXPORT_SYMBOL")
MAX_REVIEW_LINES = 20000
MAX_DIFF_CHARS = 64 << 10


def _code_only(text: str) -> str:
    """The text with comments and string and character literals blanked out,
    newlines kept (so line numbers hold); one linear pass."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def scopes(code: str) -> list[tuple[str, str, int, int]]:
    """(kind, name, first line, last line) of each brace block at file scope of
    comment-free C (lines 1-based): kind "function" for a definition (a '{' at
    depth 0 after a '(' with no '=' or ';' between, its name the identifier
    before the first '('), "type" for a struct, union or enum body, "data" for
    an initializer. One pass."""
    # Preprocessor lines (and their continuations) are not declarations.
    lines, cont = code.split("\n"), False
    for i, ln in enumerate(lines):
        if cont or ln.lstrip().startswith("#"):
            cont = ln.endswith("\\")
            lines[i] = ""
    code = "\n".join(lines)
    out = []
    depth, line, start, kind, name = 0, 1, 1, "", ""
    head: list[str] = []
    for c in code:
        if c == "\n":
            line += 1
        if depth == 0:
            if c == "{":
                h = "".join(head)
                at = h.find("(")
                if at > 0 and "=" not in h:
                    k = len(h[:at].rstrip())
                    j = k
                    while j > 0 and (h[j - 1].isalnum() or h[j - 1] == "_"):
                        j -= 1
                    kind, name = "function", h[j:k]
                    start = line - h.count("\n") + h[:j].count("\n")
                else:
                    kind = "type" if "=" not in h and re.search(
                        r"\b(?:struct|union|enum)\b", h) else "data"
                    name, start = "", line
                head = []
                depth = 1
            elif c in ";}":
                head = []
            else:
                head.append(c)
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                out.append((kind, name, start, line))
    return out


def functions(code: str) -> list[tuple[str, int, int]]:
    """(name, first line, last line) of each function definition at file scope
    of comment-free C (scopes)."""
    return [(name, a, b) for kind, name, a, b in scopes(code) if kind == "function" and name]


def _owners(blocks: list[tuple[str, str, int, int]], nlines: int) -> list[str]:
    """For each line (0-based), the function it is in, "{type}" in a struct,
    union or enum body, or "" at file scope: one pass, however many functions."""
    owner = [""] * (nlines + 1)
    for kind, name, a, b in blocks:
        tag = name if kind == "function" else "{type}" if kind == "type" else ""
        if tag:
            for ln in range(max(a, 1), min(b, nlines) + 1):
                owner[ln - 1] = tag
    return owner


@dataclass
class Review:
    diff: str = ""                  # unified diff against the starter (capped)
    changed: int = 0                # lines added or removed (blank and comment lines aside)
    functions: list[str] = field(default_factory=list)   # functions the changes touch
    flags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"diff": self.diff, "changed": self.changed, "functions": self.functions,
                "flags": self.flags}


class _Layout:
    """One source as the review reads it: live code lines, normalised, each
    line's owner, the file's functions and macros, and which identifiers each
    function names."""

    def __init__(self, text: str, kernel: KernelMacros | None):
        code, self.pp_flags, self.macros = live_code(_code_only(text), kernel)
        self.lines = code.split("\n")
        self.norm = [" ".join(x.split()) for x in self.lines]
        blocks = scopes(code)
        self.owner = _owners(blocks, len(self.lines))
        self.funcs = {name for kind, name, _, _ in blocks if kind == "function" and name}
        self.named_in: dict[str, set[str]] = {}         # identifier -> owners naming it
        self.counts: dict[str, int] = {}
        self.address_of: dict[str, int] = {}          # uses as &name (unary, the name alone)
        self.calls: dict[str, int] = {}               # name -> calls of it
        for i, ln in enumerate(self.norm):
            if ln.startswith("#"):
                continue
            for tok in _IDENT.findall(ln):
                self.named_in.setdefault(tok, set()).add(self.owner[i])
                self.counts[tok] = self.counts.get(tok, 0) + 1
            for tok in _CALL.findall(ln):
                self.calls[tok] = self.calls.get(tok, 0) + 1
            for m in _ADDRESS_OF.finditer(ln):
                before = ln[:m.start()].rstrip()
                if not before or before[-1] in "(,=!{;:?+-*/<>|^~[":
                    self.address_of[m.group(1)] = self.address_of.get(m.group(1), 0) + 1

    def undeclared_addresses(self, line: str) -> list[str]:
        """Names in line whose address is taken (&name) that the file only
        calls or takes the address of: never declares as a variable, never
        defines as a function. A variable of the driver's is declared before
        its address is taken; such a name is a kernel function (issue 33: a
        walk from the address of an allowed import into the fabric's data)."""
        return [n for n in (m.group(1) for m in _ADDRESS_OF.finditer(line))
                if self.address_of.get(n, 0) + self.calls.get(n, 0) >= self.counts.get(n, 0)
                and n not in self.macros and n not in self.funcs]

    def in_fix(self, fix: set[str], starter_funcs: set[str]) -> set[str]:
        """The fix functions and the new functions only they call (a helper
        holding the fix): named nowhere else, transitively."""
        scope = set(fix)
        new = self.funcs - starter_funcs - scope
        # Each new function waits for its users to join; a worklist, linear
        # in the number of (user, function) pairs.
        waiting: dict[str, int] = {}
        helpers_of: dict[str, list[str]] = {}
        for h in new:
            users = self.named_in.get(h, set()) - {h}
            if not users:
                continue
            waiting[h] = len(users - scope)
            for u in users - scope:
                helpers_of.setdefault(u, []).append(h)
        work = [h for h, n in waiting.items() if n == 0]
        while work:
            h = work.pop()
            scope.add(h)
            for g in helpers_of.get(h, ()):
                waiting[g] -= 1
                if waiting[g] == 0:
                    work.append(g)
        return scope


def _substantive(line: str, owner: str, ok_calls: set[str]) -> bool:
    """Whether a line the submission adds outside the fix does more than an
    ordinary refactor: a call to what ok_calls leaves out (prints, lookups,
    the file's own functions and macros, and what the submission calls no
    more often than the starter: code moved to a helper); at file scope, a
    declaration that links or runs by itself; in a struct body, anything but
    a member. Lines removed only undo the starter's work: no flag."""
    if not line or line.startswith("#"):
        return False            # directives: read by live_code; includes: the object check
    if owner == "{type}":
        return not re.fullmatch(r"[\w \t*\[\]]+;|[\w \t*\[\]:]+[0-9]+;|\};?", line)
    if not owner and _FILE_SCOPE_LINKS.search(line):
        return True
    return any(not (c in _BENIGN_CALLS or c in ok_calls or _PRINT.match(c))
               for c in _CALL.findall(line))


def review(starter: str, text: str, fix_functions: Iterable[str] = (),
           name: str = "ringdrv.c", kernel: KernelMacros | None = None) -> Review:
    """A submission against the starter, for the instructor: the diff, the
    functions it changes, and flags when it changes functions outside
    fix_functions (and the new functions only they call) beyond an ordinary
    refactor (_substantive), when its new code walks kernel memory (_WALKING,
    _INT_CAST outside prints, _USER_COPY), and for preprocessor tricks
    (live_code). Both sources are read as the compiler reads them (live_code,
    with the kernel's macros when given). Flags change no score. Linear in the
    size of the source but for the line diff, capped at MAX_REVIEW_LINES."""
    import difflib
    r = Review()
    a_lines, b_lines = starter.split("\n"), text.split("\n")
    if len(b_lines) > MAX_REVIEW_LINES:
        r.flags.append(f"the source has {len(b_lines)} lines: not compared with the starter")
        return r
    diff = "\n".join(difflib.unified_diff(a_lines, b_lines, f"starter/{name}", name,
                                          lineterm=""))
    r.diff = diff if len(diff) <= MAX_DIFF_CHARS else (
        diff[:MAX_DIFF_CHARS] + f"\n[... {len(diff) - MAX_DIFF_CHARS} more characters cut]")
    a, b = _Layout(starter, kernel), _Layout(text, kernel)
    fix = set(fix_functions)
    scope = b.in_fix(fix, a.funcs) if fix else set()
    ok_calls = b.funcs | set(b.macros) | {c for c, n in b.calls.items()
                                           if n <= a.calls.get(c, 0)}
    touched: set[str] = set()
    outside: set[str] = set()
    added: list[str] = []
    # Blank lines are never changes: left out of the matching, where thousands
    # of them would each be compared with each of the starter's.
    a_at = [k for k, x in enumerate(a.norm) if x]
    b_at = [k for k, x in enumerate(b.norm) if x]
    sm = difflib.SequenceMatcher(None, [a.norm[k] for k in a_at], [b.norm[k] for k in b_at],
                                 autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        for side, at, lo, hi in ((a, a_at, i1, i2), (b, b_at, j1, j2)):
            for k in (at[x] for x in range(lo, hi)):
                line = side.norm[k]
                r.changed += 1
                if side is b:
                    added.append(line)
                f = side.owner[k]
                if f and f != "{type}":
                    touched.add(f)
                if fix and side is b and f not in scope and _substantive(line, f, ok_calls):
                    outside.add(f if f and f != "{type}" else "file-scope code")
    r.functions = sorted(touched)
    if outside:
        r.flags.append("changes outside the functions a fix touches ("
                       + ", ".join(sorted(fix)) + "): "
                       + ", ".join(sorted(outside - {"file-scope code"})
                                   + (["file-scope code"] if "file-scope code" in outside
                                      else [])))
    r.flags += b.pp_flags
    hits: dict[str, set[str]] = {}
    in_print = False
    for line in added:
        for rx, what in _WALKING:
            for m in rx.finditer(line):
                hits.setdefault(what, set()).add(m.group(0).strip())
        call = _CALL.match(line)
        in_print = in_print or bool(call and _PRINT.match(call.group(1)))
        if not in_print:
            for m in _INT_CAST[0].finditer(line):
                hits.setdefault(_INT_CAST[1], set()).add(m.group(0).strip())
        if line.endswith(";") or line.endswith("}"):
            in_print = False
    for line in added:
        for sym in b.undeclared_addresses(line):
            hits.setdefault(_ADDRESS, set()).add("&" + sym)
    copies = sorted(t for t, n in b.counts.items()
                    if n > a.counts.get(t, 0) and _USER_COPY.search(t))
    if copies:
        hits["user-copy helpers (a fix needs none)"] = set(copies)
    order = [w for _, w in _WALKING] + [_INT_CAST[1], _ADDRESS,
                                         "user-copy helpers (a fix needs none)"]
    for what in sorted(hits, key=order.index):
        shown_hits = sorted(hits[what])
        shown = ", ".join(shown_hits[:5]) + (
            f" and {len(shown_hits) - 5} more" if len(shown_hits) > 5 else "")
        r.flags.append(f"kernel-memory walking? the new code uses {what}: {shown}")
    return r


# ---------------------------------------------------------------------------- bounded

TEXT_TIMEOUT = 60.0
TEXT_MEMORY = 1 << 30


def check_text(path: str, starter: str | None, fix_functions: Iterable[str] = (),
               name: str = "ringdrv.c", kernel_file: str = "",
               timeout: float = TEXT_TIMEOUT, memory: int = TEXT_MEMORY
               ) -> tuple[list[str], Review]:
    """source_flags and review of the submission's file at `path` (against the
    starter's file at `starter`, if any) in a bounded child (bounded.call), as
    intake reads the submission: a crafted source costs at most `timeout`
    seconds and `memory` bytes of a child, never the grader's own process (a
    regular expression there holds every grading thread and Ctrl-C).
    kernel_file: a KernelMacros as JSON (write_kernel_macros). If the child is
    stopped, the checks' flag says so and the grading goes on."""
    from . import bounded
    req = {"path": path, "starter": starter, "fix": list(fix_functions), "name": name,
           "kernel_file": kernel_file}
    try:
        d = bounded.call("objcheck:_text_child", req, timeout, memory)
        return list(d["source_flags"]), Review(**d["review"])
    except (bounded.Stopped, KeyError, TypeError) as e:
        why = str(e) if isinstance(e, bounded.Stopped) else f"reading it failed ({e!r})"
        return [f"the source was not checked: {why} (the checks may take {timeout:.0f}s and "
                f"{memory >> 20} MiB)"], Review()


def _text_child(req: dict[str, Any]) -> dict[str, Any]:
    """check_text's child: read the files, run the checks."""
    import json
    with open(req["path"], encoding="utf-8", errors="replace") as f:
        text = f.read()
    out: dict[str, Any] = {"source_flags": source_flags(text), "review": Review().to_dict()}
    if req.get("starter"):
        with open(req["starter"], encoding="utf-8", errors="replace") as f:
            starter = f.read()
        kernel = None
        if req.get("kernel_file"):
            with open(req["kernel_file"], encoding="utf-8") as f:
                kernel = KernelMacros.from_dict(json.load(f))
        out["review"] = review(starter, text, req["fix"], req["name"], kernel).to_dict()
    return out
