#!/usr/bin/env python3
"""Generates bindings/python/qsakv/_cdefs.py (ctypes declarations) from include/qsakv.h.

The header is preprocessed by the C compiler (gcc -E, with tiny stand-ins for <stddef.h>
and <stdint.h> so that pycparser sees plain C and the fixed-width typedef names survive)
and parsed by pycparser. Everything ctypes needs comes from that parse: enums, struct
layouts (field order and types, array lengths after macro expansion), opaque handle
types, typedef aliases and function prototypes. Integer macros (versions, struct
versions, QSAKV_MAX_LAYERS) are evaluated by the same preprocessor.

    gen_cdefs.py                 write the file
    gen_cdefs.py --check         exit 1 (with a diff) when the committed file is stale
    gen_cdefs.py --stdout        print instead of writing

Nothing here is specific to one function of the API: a new section of the header
(structs, enums, handles, functions) regenerates without touching this script.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from pycparser import c_ast, c_parser

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_HEADER = REPO / "include" / "qsakv.h"
DEFAULT_OUTPUT = HERE.parent / "qsakv" / "_cdefs.py"
FAKE_LIBC = HERE / "fake_libc"

# C type names (after typedef resolution stops) -> ctypes. Fixed-width names are kept by
# name: the fake headers only make them parseable.
BASE_TYPES = {
    "void": None,
    "char": "ctypes.c_char",
    "signed char": "ctypes.c_byte",
    "unsigned char": "ctypes.c_ubyte",
    "short": "ctypes.c_short",
    "unsigned short": "ctypes.c_ushort",
    "int": "ctypes.c_int",
    "signed int": "ctypes.c_int",
    "unsigned int": "ctypes.c_uint",
    "unsigned": "ctypes.c_uint",
    "long": "ctypes.c_long",
    "unsigned long": "ctypes.c_ulong",
    "long long": "ctypes.c_longlong",
    "unsigned long long": "ctypes.c_ulonglong",
    "float": "ctypes.c_float",
    "double": "ctypes.c_double",
    "_Bool": "ctypes.c_bool",
    "size_t": "ctypes.c_size_t",
    "ptrdiff_t": "ctypes.c_ssize_t",
    "int8_t": "ctypes.c_int8",
    "int16_t": "ctypes.c_int16",
    "int32_t": "ctypes.c_int32",
    "int64_t": "ctypes.c_int64",
    "uint8_t": "ctypes.c_uint8",
    "uint16_t": "ctypes.c_uint16",
    "uint32_t": "ctypes.c_uint32",
    "uint64_t": "ctypes.c_uint64",
    "intptr_t": "ctypes.c_ssize_t",
    "uintptr_t": "ctypes.c_size_t",
}


def compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "gcc"))


# qsakv.h includes qsakv_version.h, which CMake generates into <build>/include from the
# project version. Where to find it: --include-dir, else $QSAKV_INCLUDE_DIR, else the
# newest <repo>/build*/include holding it.
INCLUDE_DIRS: list[Path] = []


def default_include_dirs() -> list[Path]:
    env = os.environ.get("QSAKV_INCLUDE_DIR")
    if env:
        return [Path(env)]
    found = sorted(REPO.glob("build*/include/qsakv_version.h"), key=lambda p: p.stat().st_mtime)
    return [found[-1].parent] if found else []


def include_flags() -> list[str]:
    flags = []
    for d in INCLUDE_DIRS:
        flags += ["-I", str(d)]
    return flags


def preprocess(source: Path, extra: list[str] | None = None) -> str:
    cmd = compiler() + ["-E", "-P", "-nostdinc", "-I", str(FAKE_LIBC), *include_flags(),
                        "-D__attribute__(x)=", "-D__extension__=", "-U__GNUC__",
                        *(extra or []), str(source)]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def header_macros(header: Path) -> list[tuple[str, object]]:
    """Object-like QSAKV_* macros in header order with their integer (or string) values;
    macros without such a value (the include guard, QSAKV_API) are left out."""
    text = header.read_text()
    # The text of the quoted includes found in the include directories, in place.
    def inline(m):
        for d in [header.parent, *INCLUDE_DIRS]:
            if (d / m.group(1)).exists():
                return (d / m.group(1)).read_text()
        return m.group(0)
    text = re.sub(r'^\s*#\s*include\s+"([^"]+)"', inline, text, flags=re.M)
    names = []
    for m in re.finditer(r"^\s*#\s*define\s+(QSAKV_\w+)(\()?", text, re.M):
        if m.group(2) is None and m.group(1) not in names:
            names.append(m.group(1))
    marker = "__qsakv_gen_cdefs_split__"
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.c"
        probe.write_text(f'#include "{header}"\n' + "".join(f"{marker} {n}\n" for n in names))
        out = preprocess(probe)
    chunks = out.split(marker)[1:]
    parser = c_parser.CParser()
    values = []
    for name, chunk in zip(names, chunks):
        expr = chunk.strip()
        if not expr:
            continue
        try:
            init = parser.parse(f"int __v = {expr};").ext[0].init
            values.append((name, evaluate(init, {})))
        except Exception:  # not a constant expression: not a value a binding needs
            continue
    return values


def evaluate(node, env: dict):
    """Value of a C constant expression (integers, enumerator names, strings)."""
    if isinstance(node, c_ast.Constant):
        if node.type == "string":
            return bytes(node.value[1:-1], "utf-8").decode("unicode_escape")
        if node.type in ("float", "double"):
            return float(node.value.rstrip("fFlL"))
        if node.type == "char":
            return ord(node.value[1:-1].encode().decode("unicode_escape"))
        return int(node.value.rstrip("uUlL"), 0)
    if isinstance(node, c_ast.ID):
        return env[node.name]
    if isinstance(node, c_ast.UnaryOp):
        v = evaluate(node.expr, env)
        return {"-": lambda: -v, "+": lambda: v, "~": lambda: ~v, "!": lambda: int(not v)}[node.op]()
    if isinstance(node, c_ast.BinaryOp):
        a, b = evaluate(node.left, env), evaluate(node.right, env)
        if node.op == "/":
            return int(a / b) if isinstance(a, int) and isinstance(b, int) else a / b
        if node.op == "%":
            return a - int(a / b) * b
        ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
               "<<": lambda: a << b, ">>": lambda: a >> b, "|": lambda: a | b,
               "&": lambda: a & b, "^": lambda: a ^ b}
        return ops[node.op]()
    if isinstance(node, c_ast.Cast):
        return evaluate(node.expr, env)
    raise ValueError(f"not a constant expression: {type(node).__name__}")


class Generator:
    def __init__(self, ast: c_ast.FileAST):
        self.ast = ast
        self.typedefs: dict[str, str] = {}      # alias name -> ctypes expression
        self.enum_types: set[str] = set()
        self.records: dict[str, c_ast.Node] = {}  # tag -> Struct/Union with decls
        self.record_kind: dict[str, str] = {}     # tag -> Structure/Union
        self.enums: list[tuple[str, list[tuple[str, int]]]] = []
        self.aliases: list[tuple[str, str]] = []
        self.functions: list[tuple[str, str, str | None, list[tuple[str, str]]]] = []
        self.enum_env: dict[str, int] = {}
        self.enum_fields: dict[str, dict[str, str]] = {}
        self.anon = 0

    # -- types -------------------------------------------------------------------------
    def record_name(self, node) -> str:
        if node.name is None:
            self.anon += 1
            node.name = f"_anon_{self.anon}"
        kind = "Union" if isinstance(node, c_ast.Union) else "Structure"
        self.record_kind.setdefault(node.name, kind)
        if node.decls is not None:
            self.records[node.name] = node
        return node.name

    def enum(self, node: c_ast.Enum) -> None:
        if node.values is None or any(n == node.name for n, _ in self.enums):
            return
        items, nxt = [], 0
        for e in node.values.enumerators:
            nxt = evaluate(e.value, self.enum_env) if e.value is not None else nxt
            items.append((e.name, nxt))
            self.enum_env[e.name] = nxt
            nxt += 1
        self.enums.append((node.name or f"_anon_enum_{len(self.enums)}", items))

    def base(self, t) -> str | None:
        if isinstance(t, c_ast.IdentifierType):
            name = " ".join(t.names)
            if name in self.typedefs:
                return name
            if name in BASE_TYPES:
                return BASE_TYPES[name]
            raise ValueError(f"unknown type {name!r}")
        if isinstance(t, (c_ast.Struct, c_ast.Union)):
            return self.record_name(t)
        if isinstance(t, c_ast.Enum):
            self.enum(t)
            return "ctypes.c_int"
        raise ValueError(f"unsupported type node {type(t).__name__}")

    def is_char(self, t) -> bool:
        return (isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.IdentifierType)
                and t.type.names == ["char"])

    def is_void(self, t) -> bool:
        return (isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.IdentifierType)
                and t.type.names == ["void"])

    def ctype(self, t, param: bool = False) -> str | None:
        if isinstance(t, c_ast.TypeDecl):
            return self.base(t.type)
        if isinstance(t, c_ast.Typename):
            return self.ctype(t.type, param)
        if isinstance(t, c_ast.ArrayDecl):
            if param:  # an array parameter is a pointer
                return self.pointer(t.type)
            dim = evaluate(t.dim, self.enum_env)
            return f"({self.ctype(t.type)} * {dim})"
        if isinstance(t, c_ast.PtrDecl):
            return self.pointer(t.type)
        if isinstance(t, c_ast.FuncDecl):
            ret = self.ctype(t.type) or "None"
            args = [a for a in self.params(t)]
            return f"ctypes.CFUNCTYPE({', '.join([ret] + [a for _, a in args])})"
        raise ValueError(f"unsupported declarator {type(t).__name__}")

    def pointer(self, target) -> str:
        if self.is_char(target):
            return "ctypes.c_char_p"
        if self.is_void(target):
            return "ctypes.c_void_p"
        if isinstance(target, c_ast.FuncDecl):
            return self.ctype(target)
        return f"ctypes.POINTER({self.ctype(target)})"

    def params(self, func: c_ast.FuncDecl) -> list[tuple[str, str]]:
        out = []
        for i, p in enumerate(func.args.params if func.args else []):
            if isinstance(p, c_ast.EllipsisParam):
                raise ValueError("variadic functions are not supported by this binding")
            if self.is_void(p.type) and getattr(p, "name", None) is None:
                continue  # f(void)
            out.append((p.name or f"arg{i}", self.ctype(p.type, param=True)))
        return out

    # -- declarations --------------------------------------------------------------------
    def run(self) -> None:
        for ext in self.ast.ext:
            if isinstance(ext, c_ast.Typedef):
                self.typedef(ext)
            elif isinstance(ext, c_ast.Decl):
                self.decl(ext)

    def typedef(self, node: c_ast.Typedef) -> None:
        name = node.name
        if name in BASE_TYPES:  # the fake libc's own typedefs
            return
        inner = node.type
        if isinstance(inner, c_ast.TypeDecl) and isinstance(inner.type, c_ast.Enum):
            self.enum(inner.type)
            self.enum_types.add(name)
            self.aliases.append((name, "ctypes.c_int"))
        elif (isinstance(inner, c_ast.TypeDecl)
              and isinstance(inner.type, (c_ast.Struct, c_ast.Union))
              and (inner.type.name in (None, name))):
            if inner.type.name is None:
                inner.type.name = name
            self.record_name(inner.type)
            self.typedefs[name] = name
            return
        else:
            self.aliases.append((name, self.ctype(inner)))
        self.typedefs[name] = name

    def decl(self, node: c_ast.Decl) -> None:
        t = node.type
        if isinstance(t, c_ast.FuncDecl):
            restype = self.ctype(t.type)
            c_ret = None
            if isinstance(t.type, c_ast.TypeDecl) and isinstance(t.type.type, c_ast.IdentifierType):
                c_ret = " ".join(t.type.type.names)
            self.functions.append((node.name, restype or "None", c_ret, self.params(t)))
        elif isinstance(t, (c_ast.Struct, c_ast.Union)):
            self.record_name(t)
        elif isinstance(t, c_ast.Enum):
            self.enum(t)

    def fields(self, rec) -> list[tuple[str, str]]:
        out = []
        for d in rec.decls:
            if d.bitsize is not None:
                raise ValueError(f"bit-field {rec.name}.{d.name} is not supported")
            out.append((d.name, self.ctype(d.type)))
            enum = self.enum_name(d.type)
            if enum:
                self.enum_fields.setdefault(rec.name, {})[d.name] = enum
        return out

    def enum_name(self, t) -> str | None:
        """The enum type of a declarator that is exactly an enum (typedef or tag)."""
        if not isinstance(t, c_ast.TypeDecl):
            return None
        if isinstance(t.type, c_ast.Enum):
            return t.type.name
        if isinstance(t.type, c_ast.IdentifierType):
            name = " ".join(t.type.names)
            return name if name in self.enum_types else None
        return None

    # -- output --------------------------------------------------------------------------
    def emit(self, header_name: str, macros) -> str:
        # Fields first: they may discover nested records and enums.
        fields = {tag: self.fields(rec) for tag, rec in list(self.records.items())}
        L = [f'"""ctypes declarations of {header_name}.',
             "",
             "Generated by bindings/python/tools/gen_cdefs.py with pycparser; do not edit.",
             "Regenerate with `python bindings/python/tools/gen_cdefs.py`; the binding tests",
             'fail when this file and the header drift apart."""',
             "# fmt: off",
             "import ctypes",
             "from collections import namedtuple", "", "",
             "# Macros", ""]
        for name, value in macros:
            L.append(f"{name} = {value!r}")
        L += ["", "", "# Enums", ""]
        for name, items in self.enums:
            L.append(f"# enum {name}")
            for k, v in items:
                L.append(f"{k} = {v}")
            L.append("")
        L.append("ENUMS = {")
        for name, items in self.enums:
            L.append(f"    {name!r}: {{")
            L += [f"        {k!r}: {k}," for k, _ in items]
            L.append("    },")
        L += ["}", "", "", "# Records (opaque handles have no _fields_)", ""]
        for tag, kind in self.record_kind.items():
            L += [f"class {tag}(ctypes.{kind}):", "    pass", "", ""]
        L += ["# Typedefs", ""]
        for name, expr in self.aliases:
            L.append(f"{name} = {expr}")
        L += ["", "", "# Layouts", ""]
        for tag, flds in fields.items():
            L.append(f"{tag}._fields_ = [")
            for fname, ftype in flds:
                L.append(f"    ({fname!r}, {ftype}),")
            L += ["]", ""]
        L.append("# Struct fields whose values are enums: struct -> {field: enum}")
        L.append("ENUM_FIELDS = {")
        for tag, m in self.enum_fields.items():
            L.append(f"    {tag!r}: {{" + ", ".join(f"{k!r}: {v!r}" for k, v in m.items()) + "},")
        L += ["}", ""]
        L += ["OPAQUE = (" + "".join(f"{t}, " for t in self.record_kind if t not in fields) + ")",
              "", "",
              "# Functions: name -> (restype, argtypes, argnames, C return type name)", "",
              'Function = namedtuple("Function", "restype argtypes argnames c_restype")',
              "", "FUNCTIONS = {"]
        for name, restype, c_ret, params in self.functions:
            types = "".join(f"{t}, " for _, t in params)
            names = "".join(f"{n!r}, " for n, _ in params)
            L.append(f"    {name!r}: Function({restype}, [{types.rstrip(', ')}], "
                     f"({names}), {c_ret!r}),")
        L += ["}", ""]
        return "\n".join(L)


def generate(header: Path) -> str:
    text = preprocess(header)
    ast = c_parser.CParser().parse(text, filename=str(header))
    gen = Generator(ast)
    gen.run()
    return gen.emit(f"include/{header.name}", header_macros(header))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--header", type=Path, default=DEFAULT_HEADER)
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    ap.add_argument("--include-dir", type=Path, action="append",
                    help="where qsakv_version.h is (<build>/include); default: "
                         "$QSAKV_INCLUDE_DIR, else the newest <repo>/build*/include")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail if --output is stale")
    mode.add_argument("--stdout", action="store_true")
    args = ap.parse_args(argv)
    INCLUDE_DIRS[:] = args.include_dir or default_include_dirs()
    if not any((d / "qsakv_version.h").exists() for d in INCLUDE_DIRS):
        print("gen_cdefs: qsakv_version.h not found (CMake generates it into <build>/include:"
              " configure a build first, or pass --include-dir)", file=sys.stderr)
        return 2
    code = generate(args.header.resolve())
    if args.stdout:
        sys.stdout.write(code)
        return 0
    if args.check:
        old = args.output.read_text() if args.output.exists() else ""
        if old == code:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            old.splitlines(True), code.splitlines(True), str(args.output), "regenerated"))
        print(f"\n{args.output} is stale: run {Path(__file__).name}", file=sys.stderr)
        return 1
    args.output.write_text(code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
