"""The Python and C declarations of each native artifact are twins, and cannot drift apart.

Each module of ccbridge.bindings names its artifact's one header (HEADER, under src/ccbridge/native) and
declares FUNCTIONS (name -> (restype, argtypes)), STRUCTS (C typedef name -> ctypes.Structure) and
CONSTANTS (C macro -> value). Here the header's text is parsed (its typedefs, structs, #defines and the
prototypes marked with its export macro) and every declaration is checked against it: the same functions,
argument counts and types, the same struct fields in the same order with the same types, the same values.
And nothing in ccbridge outside that package declares argtypes or restype or opens a library through ctypes.
"""

from __future__ import annotations

import ast
import ctypes
import re
from ctypes import (c_char, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_long, c_longlong, c_size_t,
                    c_ubyte, c_uint, c_uint8, c_uint32, c_uint64, c_ulong, c_ulonglong, c_void_p)
from dataclasses import dataclass
from pathlib import Path

import pytest

from ccbridge.bindings import core, emu, gcm, libcrypto, loader, ncclnet
from ccbridge.emulate.siteboot import ccbridge_sites

SRC = Path(__file__).resolve().parent.parent / "src" / "ccbridge"
NATIVE = SRC / "native"
BINDINGS = SRC / "bindings"
EXPORTED = {core: "CCB_API", loader: "CCB_API", gcm: "CCB_API", emu: "EMU_API"}  # functions marked in HEADER

SCALARS = {"int": c_int, "unsigned": c_uint, "unsigned int": c_uint, "long": c_long, "unsigned long": c_ulong,
           "long long": c_longlong, "unsigned long long": c_ulonglong, "double": c_double, "float": c_float,
           "char": c_char, "unsigned char": c_ubyte, "size_t": c_size_t, "int32_t": c_int32, "uint32_t": c_uint32,
           "int64_t": c_int64, "uint64_t": c_uint64, "uint8_t": c_uint8}
CHARS = {"char", "unsigned char", "uint8_t"}  # a pointer to these may be c_char_p


@dataclass(frozen=True)
class CType:
    base: str  # a scalar, "void", a struct's or enum's typedef name, or "fn" (a function pointer)
    depth: int = 0  # pointer levels
    array: int | None = None  # a struct field's array length
    sig: tuple | None = None  # fn: (return CType, (param CTypes), variadic)

    def __str__(self) -> str:
        if self.sig:
            ret, params, variadic = self.sig
            return f"{ret} (*)({', '.join(map(str, params)) + (', ...' if variadic else '')})"
        return self.base + " " * bool(self.depth) + "*" * self.depth + (f"[{self.array}]" if self.array else "")


def strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def split_top(text: str, sep: str) -> list[str]:
    """text split at sep outside parentheses and braces."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "({" and 1 or ch in ")}" and -1 or 0
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


def closing(text: str, at: int) -> int:
    """Index of the bracket that closes the one at text[at]."""
    depth = 0
    for i in range(at, len(text)):
        depth += {"(": 1, "{": 1, ")": -1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError("unbalanced")


class Header:
    """A header and the quoted headers it includes: macros, typedefs and structs; its own prototypes."""

    def __init__(self, path: Path):
        self.path = path
        self.own = self.code(path.read_text())
        self.constants, self.macros = {}, {}
        self.aliases, self.enums, self.bodies = {}, set(), {}
        for text in self.texts(path, set()):
            self.preprocess(text)
        for text in self.texts(path, set()):
            self.typedefs(self.expand(self.code(text)))

    def texts(self, path: Path, seen: set) -> list[str]:
        if path in seen:
            return []
        seen.add(path)
        text = path.read_text()
        inc = [t for name in re.findall(r'(?m)^#include "([^"]+)"', text) for t in self.texts(path.parent / name, seen)]
        return inc + [text]

    @staticmethod
    def code(text: str) -> str:
        """text without comments and preprocessor lines, whitespace collapsed."""
        text = strip_comments(text).replace("\\\n", " ")
        return " ".join(" ".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")).split())

    def preprocess(self, text: str) -> None:
        for line in strip_comments(text).replace("\\\n", " ").splitlines():
            if m := re.match(r"\s*#define\s+(\w+)\(([^)]*)\)\s*(.*)", line):
                self.macros[m[1]] = ([p.strip() for p in m[2].split(",")], m[3])
            elif m := re.match(r"\s*#define\s+(\w+)\s+\(?(-?(?:0x[0-9a-fA-F]+|\d+))\)?\s*$", line):
                self.constants[m[1]] = int(m[2], 0)

    def expand(self, text: str) -> str:
        """Function-like macros of the headers expanded (a struct body that lists its fields through one)."""
        for name, (params, body) in self.macros.items():
            while m := re.search(rf"\b{name}\s*\(", text):
                end = closing(text, m.end() - 1)
                args = [a.strip() for a in split_top(text[m.end():end], ",")]
                out = body
                for p, a in zip(params, args):
                    out = re.sub(rf"\b{p}\b", a, out)
                text = text[:m.start()] + " " + out + " " + text[end + 1:]
        return text

    def typedefs(self, text: str) -> None:
        while m := re.search(r"\btypedef\s+(struct|union|enum)\s*\w*\s*\{", text):
            end = closing(text, m.end() - 1)
            tail = re.match(r"\s*(\w+)\s*;", text[end + 1:])
            if m[1] == "enum":
                self.enums.add(tail[1])
            else:
                self.bodies[tail[1]] = text[m.end():end]
            text = text[:m.start()] + text[end + 1 + tail.end():]
        for m in re.finditer(r"\btypedef\s+([^;{}]+);", text):
            decl = m[1].strip()
            if sm := re.fullmatch(r"(?:struct|union)\s+\w+\s+(\w+)", decl):
                self.aliases[sm[1]] = CType(sm[1])  # opaque: only ever behind a pointer
                continue
            parts = split_top(decl, ",")
            name, ctype, base = self.decl(parts[0])
            self.aliases[name] = ctype
            for p in parts[1:]:
                name, ctype, _ = self.decl(base + " " + p)
                self.aliases[name] = ctype

    def known(self, words: str) -> bool:
        return words in SCALARS or words == "void" or words in self.aliases or words in self.enums \
            or words in self.bodies

    def decl(self, text: str, param: bool = False) -> tuple[str | None, CType, str]:
        """(name or None, its type, the type's words without the name's pointers) of one declaration."""
        text = " ".join(re.sub(r"\b(const|volatile|struct|enum|union)\b", " ", text).split())
        if fm := re.fullmatch(r"(.+?)\(\s*\*\s*(\w*)\s*\)\s*\((.*)\)", text):
            return fm[2] or None, self.fn(fm[1], fm[3]), fm[1]
        array = None
        if am := re.search(r"\[\s*(\w*)\s*\]\s*$", text):
            array = int(am[1], 0) if am[1].isdigit() else self.constants.get(am[1], 0)
            text = text[:am.start()]
        depth = text.count("*")
        words = text.replace("*", " ").split()
        name = None
        if len(words) > 1 and not self.known(" ".join(words)):
            name, words = words[-1], words[:-1]
        base = " ".join(words)
        if param and array is not None:  # an array parameter is a pointer
            depth, array = depth + 1, None
        ctype = CType(base, depth, array)
        if base in self.aliases and base not in self.bodies:
            a = self.aliases[base]
            ctype = CType(a.base, a.depth + depth, array, a.sig)
        return name, ctype, base

    def fn(self, ret: str, params: str) -> CType:
        args = [p.strip() for p in split_top(params, ",") if p.strip() and p.strip() != "void"]
        variadic = bool(args) and args[-1] == "..."
        args = args[:-1] if variadic else args
        return CType("fn", 1, None, (self.decl(ret)[1], tuple(self.decl(a, param=True)[1] for a in args), variadic))

    def prototypes(self, marker: str) -> dict[str, CType]:
        """The functions this header (not its includes) declares with marker: name -> fn CType."""
        out = {}
        for m in re.finditer(rf"\b{marker}\s+([^;(){{}}]*?)\b(\w+)\s*\(([^()]*)\)\s*;", self.expand(self.own)):
            out[m[2]] = self.fn(m[1], m[3])
        return out

    def fields(self, struct: str, flatten: bool = False) -> list[tuple[str, CType, bool]]:
        """A struct's fields in order: (name, type, came from a flattened member struct)."""
        out = []
        for stmt in split_top(self.bodies[struct], ";"):
            if not stmt.strip():
                continue
            parts = split_top(stmt, ",")
            first = self.decl(parts[0])
            for name, ctype, _ in [first] + [self.decl(first[2] + " " + p) for p in parts[1:]]:
                if flatten and ctype.depth == 0 and ctype.base in self.bodies:
                    out += [(f"{name}.{n}", t, True) for n, t, _ in self.fields(ctype.base, flatten)]
                else:
                    out.append((name, ctype, False))
        return out


def is_cfunctype(py) -> bool:
    """A ctypes.CFUNCTYPE type (its NULL instance tells its restype and argtypes)."""
    return isinstance(py, type) and py.__name__ == "CFunctionType"


def pointee(py):
    """The type a ctypes POINTER type points to, else None."""
    inner = getattr(py, "_type_", None)
    return inner if isinstance(inner, type) and py is ctypes.POINTER(inner) else None


def matches(py, c: CType, h: Header, structs: dict) -> bool:
    """Whether a ctypes type passes or holds what the C type is."""
    if c.array is not None:
        return getattr(py, "_length_", None) == c.array and matches(py._type_, CType(c.base, c.depth), h, structs)
    if c.depth == 0:
        if c.base == "void":
            return py is None
        if c.base in h.enums:
            return py is c_int
        if c.base in structs:
            return py is structs[c.base]
        return c.base in SCALARS and py is SCALARS[c.base]
    if py is c_void_p:  # any pointer, function pointers too
        return True
    if c.base == "fn":
        return is_cfunctype(py) and signature_errors(py().restype, list(py().argtypes), c, h, structs, "") == []
    if c.depth == 1 and c.base in CHARS and py is c_char_p:
        return True
    inner = pointee(py)
    return inner is not None and matches(inner, CType(c.base, c.depth - 1), h, structs)


def signature_errors(restype, argtypes: list, c: CType, h: Header, structs: dict, name: str) -> list[str]:
    ret, params, variadic = c.sig
    errs = []
    if not matches(restype, ret, h, structs):
        errs.append(f"{name}: returns {ret}, declared {restype}")
    if len(argtypes) != len(params) and not (variadic and len(argtypes) > len(params)):
        errs.append(f"{name}: {len(params)} arguments in C, {len(argtypes)} declared")
    for i, (py, ct) in enumerate(zip(argtypes, params)):
        if not matches(py, ct, h, structs):
            errs.append(f"{name}: argument {i} is {ct} in C, declared {py}")
    return errs


def header(mod) -> Header:
    return Header(NATIVE / mod.HEADER)


def struct_errors(py, cname: str, h: Header, structs: dict) -> list[str]:
    c = h.fields(cname, flatten=True)
    got = [(f[0], f[1]) for f in py._fields_]
    if len(c) != len(got):
        return [f"{cname}: {len(c)} fields in C ({[n for n, _, _ in c]}), {len(got)} declared ({[n for n, _ in got]})"]
    errs = []
    for (cn, ct, nested), (pn, pt) in zip(c, got):
        last = cn.rsplit(".", 1)[-1]  # a flattened member struct's field: vProps.ndevs may be declared vNdevs
        if cn != pn and not (nested and pn.lower().endswith(last.lower())):
            errs.append(f"{cname}: field {cn} in C where {pn} is declared")
        if not matches(pt, ct, h, structs):
            errs.append(f"{cname}.{cn}: {ct} in C, declared {pt}")
    return errs


@pytest.mark.parametrize("mod", list(EXPORTED), ids=lambda m: m.__name__)
def test_functions_are_the_headers_exports_with_their_signatures(mod):
    h = header(mod)
    protos = h.prototypes(EXPORTED[mod])
    assert len(protos) >= 9 and set(mod.FUNCTIONS) == set(protos), \
        f"{mod.HEADER} exports {sorted(set(protos) - set(mod.FUNCTIONS))} undeclared, " \
        f"{sorted(set(mod.FUNCTIONS) - set(protos))} declared but not exported"
    structs = getattr(mod, "STRUCTS", {})
    errs = [e for name, (res, args) in mod.FUNCTIONS.items()
            for e in signature_errors(res, args, protos[name], h, structs, name)]
    assert errs == []


@pytest.mark.parametrize("mod", [core, loader, ncclnet], ids=lambda m: m.__name__)
def test_structs_have_the_headers_fields_in_order(mod):
    h = header(mod)
    errs = [e for cname, py in mod.STRUCTS.items() for e in struct_errors(py, cname, h, mod.STRUCTS)]
    assert errs == []


@pytest.mark.parametrize("mod", [core, loader, ncclnet, libcrypto], ids=lambda m: m.__name__)
def test_constants_are_the_headers(mod):
    h = header(mod)
    assert mod.CONSTANTS and {k: h.constants.get(k) for k in mod.CONSTANTS} == mod.CONSTANTS


def test_the_net_plugins_logger_takes_what_ncclnet_h_passes():
    h = header(ncclnet)
    for name, py in ncclnet.FUNCTION_TYPES.items():
        assert is_cfunctype(py)
        assert signature_errors(py().restype, list(py().argtypes), h.aliases[name], h, ncclnet.STRUCTS, name) == []


def test_libcrypto_functions_are_those_common_ossl_binds():
    """The EVP calls both sides make: the Python declarations against common/ossl.h's table (what ossl.c
    resolves each member to), so the library is called the same way from C and from Python."""
    h = header(libcrypto)
    members = {n: t for n, t, _ in h.fields("ossl_api")}
    names = dict(re.findall(r'&ossl\.(\w+),\s*"(\w+)"', (NATIVE / "common" / "ossl.c").read_text()))
    both = {sym: members[m] for m, sym in names.items() if sym in libcrypto.FUNCTIONS}
    assert len(both) >= 9
    errs = [e for sym, c in both.items() for e in signature_errors(*libcrypto.FUNCTIONS[sym], c, h, {}, sym)]
    assert errs == []


def test_a_drifted_declaration_is_caught():
    """The checks bite: one argument dropped, one type changed, one field swapped."""
    h = header(loader)
    proto = h.prototypes("CCB_API")["ccb_pool_new"]
    res, args = loader.FUNCTIONS["ccb_pool_new"]
    assert signature_errors(res, args, proto, h, {}, "x") == []
    assert signature_errors(res, args[:-1], proto, h, {}, "x")
    assert signature_errors(res, [c_double] + args[1:], proto, h, {}, "x")

    class Swapped(ctypes.Structure):
        _fields_ = [loader.File._fields_[1], loader.File._fields_[0], loader.File._fields_[2]]

    assert struct_errors(Swapped, "ccb_file", h, {})


def test_every_binding_module_names_its_header():
    mods = {p.stem for p in BINDINGS.glob("*.py")} - {"__init__"}
    assert mods == {"core", "loader", "gcm", "emu", "ncclnet", "libcrypto", "libc"}
    for mod in (core, loader, gcm, emu, ncclnet, libcrypto):
        assert (NATIVE / mod.HEADER).is_file()


def declarations(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module sets argtypes or restype, opens a library (CDLL(...) and kin), makes a function type or
    reads a table from a library, or defines a ctypes Structure or Union."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("argtypes", "restype", "in_dll"):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("CDLL", "PyDLL", "LoadLibrary", "CFUNCTYPE"):
                out.append((node.lineno, f"{name}("))
        elif isinstance(node, ast.ClassDef):
            bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
            out += [(node.lineno, f"class {node.name}({b})") for b in bases if b in ("Structure", "Union")]
    return out


def test_no_ctypes_declarations_outside_the_bindings():
    found = [f"{py.relative_to(SRC)}:{line} {what}" for py in SRC.rglob("*.py") if BINDINGS not in py.parents
             for line, what in declarations(ast.parse(py.read_text()))]
    assert found == []
    assert len(declarations(ast.parse((BINDINGS / "core.py").read_text()))) >= 3  # the scan does see them


def test_the_call_site_hook_loads_the_emulators_binding_without_ccbridge():
    assert Path(ccbridge_sites.EMU_BINDING).resolve() == Path(emu.__file__).resolve()
    tree = ast.parse(Path(emu.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "ctypes"}, "bindings/emu.py runs in traced programs: standard library only"
