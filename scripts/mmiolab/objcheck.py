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
from typing import Iterable, NamedTuple

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

_SOURCE_FLAGS = [
    (re.compile(r"\b(?:asm|__asm__|__asm)\b"), "inline assembly"),
    (re.compile(r"__builtin_(?:return|frame)_address"), "__builtin_return_address or "
     "__builtin_frame_address"),
    (re.compile(r"\.incbin\b"), ".incbin"),
    (re.compile(r"^\s*#\s*include\s*[\"<]\s*(?:/|\.\.)", re.M), "#include of a path outside "
     "the kernel's headers"),
    (re.compile(r"^\s*#\s*include\s+[^\"<\s]", re.M), "#include of a macro"),
]


def source_flags(text: str) -> list[str]:
    """What in a source deserves a look (a hint: macros can hide any of it)."""
    return [f"the source uses {what}" for rx, what in _SOURCE_FLAGS if rx.search(text)]


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
    (re.compile(r"\bcurrent\s*->\s*(?:fs|mm|active_mm|files|cred|real_parent|parent|"
                r"group_leader|tasks|nsproxy)\b|\b(?:init_task|init_mm|for_each_process|"
                r"find_vpid|pid_task|get_task_mm|mm_struct|fs_struct|files_struct|"
                r"address_space|i_mapping|f_mapping|d_inode|find_get_page|"
                r"swapper_pg_dir|pgd_offset|p4d_offset|pud_offset|pmd_offset|"
                r"pte_offset_kernel|lookup_address|kallsyms_lookup_name)\b"),
     "current->fs, current->mm or other kernel structures a driver does not need"),
    (re.compile(r"\b(?:__)?(?:copy_from_user|copy_to_user|get_user|put_user|"
                r"strncpy_from_user|copy_from_kernel_nofault|copy_to_kernel_nofault|"
                r"get_kernel_nofault|access_ok|user_access_begin|unsafe_get_user|"
                r"unsafe_put_user|raw_copy_from_user|raw_copy_to_user)\b"),
     "user-copy helpers (a fix needs none)"),
    (re.compile(r"\*\s*\(\s*(?:const\s+)?(?:volatile\s+)?(?:unsigned\s+)?"
                r"(?:long|int|char|short|u8|u16|u32|u64|void|uintptr_t|size_t)\s*\*+\s*\)"
                r"|\(\s*(?:unsigned\s+long|uintptr_t|u64|long|size_t|phys_addr_t)\s*\)"
                r"|\b0x[fF]{6}[0-9a-fA-F]{4,}|\b(?:memmem|strnstr|memchr)\b"),
     "integer casts of pointers, raw reads through casts or kernel-address constants "
     "(memory scanning)"),
]
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


def functions(code: str) -> list[tuple[str, int, int]]:
    """(name, first line, last line) of each function definition at file scope
    of comment-free C (lines 1-based): a '{' at depth 0 after a '(' with no '='
    or ';' between, its name the identifier before the first '('."""
    # Preprocessor lines (and their continuations) are not declarations.
    lines, cont = code.split("\n"), False
    for i, ln in enumerate(lines):
        if cont or ln.lstrip().startswith("#"):
            cont = ln.endswith("\\")
            lines[i] = ""
    code = "\n".join(lines)
    out = []
    depth, line, start, name = 0, 1, 1, ""
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
                    name, start = h[j:k], line - h.count("\n") + h[:j].count("\n")
                else:
                    name = ""
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
            if depth == 0 and name:
                out.append((name, start, line))
                name = ""
    return out


def _where(funcs: list[tuple[str, int, int]], lineno: int) -> str:
    return next((f for f, a, b in funcs if a <= lineno <= b), "")


@dataclass
class Review:
    diff: str = ""                  # unified diff against the starter (capped)
    changed: int = 0                # lines added or removed (blank and comment lines aside)
    functions: list[str] = field(default_factory=list)   # functions the changes touch
    flags: list[str] = field(default_factory=list)


def review(starter: str, text: str, fix_functions: Iterable[str] = (),
           name: str = "ringdrv.c") -> Review:
    """A submission against the starter, for the instructor: the diff, the
    functions it changes, and flags when it changes functions outside
    fix_functions (or file-scope code other than an #include of the kernel's
    headers) or its new code walks kernel memory (_WALKING). Flags change no
    score."""
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
    a_code, b_code = _code_only(starter), _code_only(text)
    a_norm = [" ".join(x.split()) for x in a_code.split("\n")]
    b_norm = [" ".join(x.split()) for x in b_code.split("\n")]
    a_funcs, b_funcs = functions(a_code), functions(b_code)
    touched: set[str] = set()
    added: list[str] = []
    outside_scope = False
    sm = difflib.SequenceMatcher(None, a_norm, b_norm, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        for i in range(i1, i2):
            if a_norm[i]:
                r.changed += 1
                f = _where(a_funcs, i + 1)
                touched.add(f)
                outside_scope |= not f
        for j in range(j1, j2):
            if b_norm[j]:
                r.changed += 1
                added.append(b_norm[j])
                f = _where(b_funcs, j + 1)
                if f:
                    touched.add(f)
                elif not re.match(r"#\s*include\s*<(?:linux|asm)/[\w/.-]+>\Z", b_norm[j]):
                    outside_scope = True
                    touched.add("")
    r.functions = sorted(f for f in touched if f)
    fix = set(fix_functions)
    if fix:
        out = sorted(f for f in touched if f and f not in fix)
        if outside_scope:
            out.append("file-scope code")
        if out:
            r.flags.append("changes outside the functions a fix touches ("
                           + ", ".join(sorted(fix)) + "): " + ", ".join(out))
    body = "\n".join(added)
    for rx, what in _WALKING:
        hits = sorted({m.group(0).strip() for m in rx.finditer(body)})
        if hits:
            shown = ", ".join(hits[:5]) + (f" and {len(hits) - 5} more" if len(hits) > 5 else "")
            r.flags.append(f"kernel-memory walking? the new code uses {what}: {shown}")
    return r
