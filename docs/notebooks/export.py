#!/usr/bin/env python
"""Run every notebook of the user guide headless and export it to HTML.

    python docs/notebooks/export.py                    # all, into build/docs/<name>.html
    python docs/notebooks/export.py 01_getting_started --out build/html

Each notebook runs in its own `marimo export html` process. marimo exits non-zero when a
cell raises (a failed `assert` included), and this script stops at the first failure
with that exit status. A notebook is exported from a copy in a temporary directory,
because marimo writes a `__marimo__/` session cache next to the notebook it runs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_OUT = ROOT / "build" / "docs"
TIMEOUT_S = 600


def notebooks() -> list[Path]:
    """The guide's notebooks, in reading order (NN_name.py)."""
    return sorted(HERE.glob("[0-9][0-9]_*.py"))


def export(notebook: Path, html: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``notebook`` and write ``html``; the completed process (check its returncode)."""
    html.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="torchtpu_nb_") as tmp:
        copy = Path(tmp) / notebook.name
        shutil.copy2(notebook, copy)
        cmd = [sys.executable, "-m", "marimo", "export", "html", str(copy), "-o", str(html), "--force"]
        return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="notebooks to export (default: all), e.g. 01_getting_started")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = p.parse_args()
    chosen = notebooks()
    if args.names:
        chosen = [nb for nb in chosen if nb.stem in args.names or nb.name in args.names]
        missing = set(args.names) - {nb.stem for nb in chosen} - {nb.name for nb in chosen}
        if missing:
            print(f"error: no such notebook: {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    for nb in chosen:
        html = args.out / f"{nb.stem}.html"
        t0 = time.perf_counter()
        proc = export(nb, html)
        took = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stdout[-5000:], proc.stderr[-5000:], sep="\n", file=sys.stderr)
            print(f"FAILED  {nb.name} (exit {proc.returncode}, {took:.1f} s)", file=sys.stderr)
            return proc.returncode
        print(f"ok      {nb.name} -> {html.relative_to(ROOT) if html.is_relative_to(ROOT) else html} ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
