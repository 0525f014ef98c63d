"""The package's layers (DESIGN.md): nothing imports a layer above it.

Read from the source, every import counted, including those inside functions (a lazy
import is still a dependency). Each layer lists what it may import besides itself and
the leaf modules every layer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "torchtpu"
LEAVES = {"config", "errors", "metrics", "_spans", "op_report"}  # import no layer themselves
CORE = ["runtime", "stablehlo", "lowering", "tensor", "runner", "eager"]  # bottom to top
MAY_IMPORT = {
    "runtime": set(),
    "stablehlo": set(),
    "lowering": {"stablehlo"},  # rules only describe programs
    "tensor": {"runtime"},
    "runner": {"tensor", "lowering", "stablehlo", "runtime"},
    "eager": {"runner", "tensor", "lowering", "stablehlo", "runtime"},
}


def _imported_modules(path: Path, source: str | None = None, exact: bool = False) -> list:
    """The torchtpu modules ``path`` imports, as dotted parts (relative imports resolved;
    ``from pkg import name`` gives ``pkg``, ``from . import name`` the package's ``name``);
    ``exact``: with whether the module itself must exist (not so for ``from . import name``,
    where ``name`` may be an attribute)."""
    package = list(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            parts = base + (node.module.split(".") if node.module else [])
            names = [(parts, True)] if node.module else [(parts + [a.name], False) for a in node.names]
        elif isinstance(node, ast.Import):
            names = [(a.name.split("."), True) for a in node.names]
        else:
            continue
        out.extend((p, strict) if exact else p for p, strict in names if p and p[0] == "torchtpu")
    return out


def _imported_layers(path: Path, source: str | None = None) -> set[str]:
    """The top-level torchtpu modules ``path`` imports."""
    return {p[1] for p in _imported_modules(path, source) if len(p) > 1}


def _exists(parts: list[str]) -> bool:
    where = PACKAGE.parent.joinpath(*parts)
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _layer_imports(layer: str) -> dict[str, set[str]]:
    return {str(f.relative_to(PACKAGE)): _imported_layers(f) - {layer} for f in sorted((PACKAGE / layer).rglob("*.py"))}


@pytest.mark.parametrize("layer", CORE)
def test_layer_imports_only_layers_below_it(layer: str) -> None:
    allowed = MAY_IMPORT[layer] | LEAVES
    wrong = {f: sorted(m - allowed) for f, m in _layer_imports(layer).items() if m - allowed}
    assert not wrong, f"{layer}/ imports layers above it or beside it: {wrong}"


def test_leaves_import_no_layer() -> None:
    wrong = {leaf: sorted(_imported_layers(PACKAGE / f"{leaf}.py") - LEAVES) for leaf in LEAVES}
    assert not any(wrong.values()), wrong


def test_every_import_names_a_module_that_exists() -> None:
    """A lazy import of a moved module fails only when its function first runs."""
    missing = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        # ``from pkg import name``: pkg must exist; ``from . import name``: name may be an attribute
        gone = [".".join(p) for p, exact in _imported_modules(f, exact=True) if not _exists(p) and (exact or not _exists(p[:-1]))]
        if gone:
            missing[str(f.relative_to(PACKAGE))] = gone
    assert not missing, missing


def test_the_checker_sees_function_level_and_relative_imports() -> None:
    """A check that cannot fail proves nothing: plant the imports it must catch."""
    source = "import torchtpu.compile\ndef f():\n    from ..eager import dispatch\n    from .. import runner\n"
    found = _imported_layers(PACKAGE / "lowering" / "planted.py", source)
    assert found == {"compile", "eager", "runner"}
