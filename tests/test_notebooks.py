"""The user guide's marimo notebooks (docs/notebooks/) run headless without a failing cell.

Each notebook checks what it shows with `assert`s; `marimo export html` exits non-zero
when any cell raises, so exporting a notebook is its test. Only the first notebook runs
in `make test`; the others are marked slow (`make test-all`, `make docs`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "docs" / "notebooks"
FAST = {"01_getting_started"}

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("marimo") is None,
    reason="marimo is not installed: pip install marimo (or the 'docs' extra) to run the notebook tests",
)


def _exporter():
    """docs/notebooks/export.py, the same code `make docs` runs."""
    spec = importlib.util.spec_from_file_location("notebook_export", NOTEBOOKS / "export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _params() -> list:
    return [pytest.param(nb, id=nb.stem, marks=() if nb.stem in FAST else pytest.mark.slow) for nb in _exporter().notebooks()]


def test_every_notebook_is_collected() -> None:
    names = {nb.stem for nb in _exporter().notebooks()}
    assert FAST <= names and len(names) >= 8, names


@pytest.mark.parametrize("notebook", _params())
def test_notebook_runs(notebook: Path, tmp_path: Path) -> None:
    html = tmp_path / f"{notebook.stem}.html"
    proc = _exporter().export(notebook, html)
    assert proc.returncode == 0, f"{notebook.name} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert html.is_file() and html.stat().st_size > 10_000, "marimo wrote no HTML"


def test_a_failing_cell_fails_the_export(tmp_path: Path) -> None:
    """The premise of the tests above: an assert that fails in any cell fails the export."""
    notebook = tmp_path / "99_fails.py"
    notebook.write_text(
        "import marimo\n\napp = marimo.App()\n\n\n@app.cell\ndef _():\n    x = 1\n    return (x,)\n\n\n"
        "@app.cell\ndef _(x):\n    assert x == 2, 'planted failure'\n    return\n"
    )
    proc = _exporter().export(notebook, tmp_path / "out.html")
    assert proc.returncode != 0
    assert "planted failure" in proc.stdout + proc.stderr
