"""Reading a kernel's StableHLO text: its functions, the entry's signature, renamed symbols.

A kernel arrives as MLIR text: one or more ``func.func`` definitions, bare or inside a
``module`` (what ``jax.jit(f).lower(...).as_text()`` prints, with module attributes,
``jax.result_info`` / ``mhlo.sharding`` / ``mhlo.layout_mode`` argument attributes and
private helper functions). :func:`parse` splits it into functions without interpreting
their bodies; :meth:`KernelModule.render` prints them back as private functions whose
symbols all start with a prefix the program builder chooses, so that two kernels, or one
kernel used twice, live in one fused program without colliding. Argument and result
attributes are dropped: in a private function they mean nothing (sharding, layouts and
result names belong to an entry function), and some would confuse XLA.

Only the outline is parsed here (the signature, balanced brackets, strings, symbols);
XLA's MLIR parser checks the rest when the kernel is verified (``_core.py``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import TpuError
from ..stablehlo.types import SUPPORTED_DTYPES, element_type


class KernelError(TpuError, ValueError):
    """A custom kernel is wrong: malformed text, a signature or shape function that does
    not match the call, an argument the kernel cannot take."""


_STRING = r'"(?:[^"\\]|\\.)*"'
_BARE = r"[A-Za-z_$.][\w$.\-]*"
_STRING_RE = re.compile(_STRING)
_TOKEN = re.compile(rf"(?P<sym>@(?:{_STRING}|{_BARE}))|(?P<str>{_STRING})")
_SYMBOL = re.compile(rf"@({_STRING}|{_BARE})")
_ELEMENT = {element_type(d): d for d in SUPPORTED_DTYPES}
_OPEN, _CLOSE = "([{<", ")]}>"


@dataclass(frozen=True)
class Function:
    name: str  # the symbol, unquoted
    args: tuple[tuple[str, str], ...]  # (SSA name, type text)
    results: tuple[str, ...]  # type texts
    body: str  # the text between the body's braces


class KernelModule:
    """The functions of one kernel's text and which one is called."""

    def __init__(self, functions: dict[str, Function], entry: str, what: str):
        if entry not in functions:
            names = ", ".join("@" + n for n in functions) or "none"
            raise KernelError(f"{what}: the text defines no function @{entry} (it defines {names}); pass entry= to choose one")
        self.functions = functions
        self.entry = functions[entry]
        self.what = what
        # the same functions and entry give the same key, whatever text they came from
        self.key = hashlib.sha256((entry + "\0" + self.render("")[1]).encode()).hexdigest()

    def arg_types(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [parse_type(t, f"{self.what}: argument {name} of @{self.entry.name}") for name, t in self.entry.args]

    def result_types(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [parse_type(t, f"{self.what}: result {i} of @{self.entry.name}") for i, t in enumerate(self.entry.results)]

    def render(self, prefix: str) -> tuple[str, str]:
        """``(entry symbol, text)``: every function private, every symbol prefixed."""
        names = _new_names(list(self.functions), prefix)

        def rename(m: re.Match) -> str:
            if m.group("sym") is None:
                return m.group(0)
            old = _unquote(m.group("sym")[1:])
            return "@" + names[old] if old in names else m.group(0)

        parts = []
        for f in self.functions.values():
            args = ", ".join(f"{n}: {t}" for n, t in f.args)
            results = ", ".join(f.results)
            body = _TOKEN.sub(rename, f.body)
            parts.append(f"  func.func private @{names[f.name]}({args}) -> ({results}) {{{body}}}\n")
        return names[self.entry.name], "".join(parts)


def _new_names(old: Sequence[str], prefix: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in old:
        new = prefix + re.sub(r"[^\w$.]", "_", name)
        while new in out.values():
            new += "_"
        out[name] = new
    return out


def _unquote(sym: str) -> str:
    if sym.startswith('"'):
        return sym[1:-1].encode().decode("unicode_escape")
    return sym


def parse_type(text: str, what: str) -> tuple[tuple[int, ...], torch.dtype]:
    """``tensor<4x8xf32>`` -> ``((4, 8), torch.float32)``; static shapes and our dtypes only."""
    t = text.replace(" ", "")
    m = re.fullmatch(r"tensor<((?:\d+x)*)([^<>]+|complex<f(?:32|64)>)>", t)
    if m is None or m.group(2) not in _ELEMENT:
        raise KernelError(
            f"{what} has type {text!r}: a kernel's entry function must take and return ranked tensors of static "
            f"shape and a dtype torch knows (e.g. tensor<4x8xf32>, tensor<f32>, tensor<3xi64>)"
        )
    dims = tuple(int(d) for d in m.group(1).split("x") if d)
    return dims, _ELEMENT[m.group(2)]


# ----------------------------------------------------------------------------------------
# the outline parser
# ----------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, text: str, what: str):
        self.s = _strip_noise(text)
        self.i = 0
        self.what = what

    def error(self, expected: str) -> KernelError:
        line = self.s.count("\n", 0, self.i) + 1
        found = self.s[self.i : self.i + 40].split("\n")[0] or "the end of the text"
        return KernelError(f"{self.what}: malformed StableHLO text, line {line}: expected {expected}, found {found!r}")

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def at(self, word: str) -> bool:
        self.ws()
        return self.s.startswith(word, self.i) and not _ident_char(self.s, self.i + len(word))

    def take(self, word: str) -> None:
        if not self.at(word):
            raise self.error(repr(word))
        self.i += len(word)

    def peek(self) -> str:
        self.ws()
        return self.s[self.i] if self.i < len(self.s) else ""

    def balanced(self) -> str:
        """The bracketed group at the cursor, without its outer brackets. Only the group's own
        bracket kind is counted (a body's ``->`` or ``dense<...>`` cannot confuse it), and
        strings are skipped (``mhlo.sharding = "{replicated}"``)."""
        self.ws()
        start, s = self.i, self.s
        if self.peek() not in _OPEN:
            raise self.error("an opening bracket")
        opening = s[start]
        closing = _CLOSE[_OPEN.index(opening)]
        depth = 0
        while self.i < len(s):
            c = s[self.i]
            if c == '"':
                m = _STRING_RE.match(s, self.i)
                if m is None:
                    raise self.error("a closed string")
                self.i = m.end()
                continue
            if c == opening:
                depth += 1
            elif c == closing:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return s[start + 1 : self.i - 1]
            self.i += 1
        self.i = start
        raise self.error(f"a closing {closing!r} for this {opening!r}")

    def symbol(self) -> str:
        self.ws()
        m = _SYMBOL.match(self.s, self.i)
        if m is None:
            raise self.error("a symbol name such as @main")
        self.i = m.end()
        return _unquote(m.group(1))

    def type_token(self) -> str:
        """One type (``tensor<4xf32>``) up to whitespace, ``{`` or the end, brackets balanced."""
        self.ws()
        start, depth = self.i, 0
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "<":
                depth += 1
            elif c == ">":
                depth -= 1
            elif depth == 0 and (c.isspace() or c in "{,"):
                break
            self.i += 1
        if self.i == start:
            raise self.error("a type")
        return self.s[start : self.i]


def _ident_char(s: str, i: int) -> bool:
    return i < len(s) and (s[i].isalnum() or s[i] in "_.$")


def _strip_noise(text: str) -> str:
    """Drop comments, location aliases and ``loc(...)`` annotations (outside strings)."""
    out, i, s = [], 0, text
    while i < len(s):
        c = s[i]
        if c == '"':
            m = _STRING_RE.match(s, i)
            end = m.end() if m else len(s)
            out.append(s[i:end])
            i = end
        elif s.startswith("//", i):
            i = s.find("\n", i) if "\n" in s[i:] else len(s)
        elif s.startswith("#loc", i) and (i == 0 or s[i - 1] == "\n"):
            i = s.find("\n", i) if "\n" in s[i:] else len(s)
        elif s.startswith("loc(", i) and (i == 0 or not _ident_char(s, i - 1)):
            i = _skip_parens(s, i + 3)
        else:
            out.append(c)
            i += 1
    return re.sub(r"[ \t]+\n", "\n", "".join(out))


def _skip_parens(s: str, i: int) -> int:
    depth = 0
    while i < len(s):
        if s[i] == '"':
            m = _STRING_RE.match(s, i)
            i = m.end() if m else len(s)
            continue
        depth += {"(": 1, ")": -1}.get(s[i], 0)
        i += 1
        if depth == 0:
            break
    return i


def split_top(text: str) -> list[str]:
    """Split at commas outside brackets and strings."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            m = _STRING_RE.match(text, i)
            i = m.end() if m else len(text)
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE and not (c == ">" and text[i - 1 : i] == "-"):
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    tail = text[start:]
    if tail.strip() or parts:
        parts.append(tail)
    return [p.strip() for p in parts]


def _without_attrs(entry: str) -> str:
    """``tensor<4xf32> {mhlo.sharding = "..."}`` -> ``tensor<4xf32>``."""
    r = _Reader(entry, "")
    return r.type_token()


def _parse_function(r: _Reader) -> Function:
    r.take("func.func")
    for vis in ("public", "private", "nested"):
        if r.at(vis):
            r.take(vis)
    name = r.symbol()
    if r.peek() != "(":
        raise r.error(f"the argument list of @{name}")
    args = []
    for entry in split_top(r.balanced()):
        m = re.match(r"(%[\w$.\-]+)\s*:\s*(.*)$", entry, re.S)
        if m is None:
            raise KernelError(f"{r.what}: malformed argument {entry!r} of @{name} (expected %name: type)")
        args.append((m.group(1), _without_attrs(m.group(2))))
    results: list[str] = []
    if r.at("->"):
        r.take("->")
        if r.peek() == "(":
            results = [_without_attrs(e) for e in split_top(r.balanced())]
        else:
            results = [r.type_token()]
    if r.at("attributes"):
        r.take("attributes")
        r.balanced()
    if r.peek() != "{":
        raise r.error(f"the body of @{name}")
    return Function(name, tuple(args), tuple(results), r.balanced())


def parse(text: str, what: str, entry: str = "main") -> KernelModule:
    """The functions of ``text`` (bare ``func.func`` definitions or one ``module``)."""
    if not isinstance(text, str):
        raise KernelError(f"{what}: the kernel's text must be a str, got {type(text).__name__}")
    r = _Reader(text, what)
    if r.at("module"):
        r.take("module")
        if r.peek() == "@":
            r.symbol()
        if r.at("attributes"):
            r.take("attributes")
            r.balanced()
        if r.peek() != "{":
            raise r.error("the module's body")
        r = _Reader(r.balanced(), what)
    functions: dict[str, Function] = {}
    while r.peek():
        if not r.at("func.func"):
            raise r.error("func.func (a kernel's text holds only function definitions)")
        f = _parse_function(r)
        if f.name in functions:
            raise KernelError(f"{what}: the text defines @{f.name} twice")
        functions[f.name] = f
    if len(functions) == 1 and entry not in functions:
        entry = next(iter(functions))
    return KernelModule(functions, entry, what)
