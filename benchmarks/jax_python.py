"""Which python runs the benchmarks' JAX reference scripts (bench_jax.py, jax_models.py).

torchtpu never imports jax; the JAX columns run in a subprocess of a python that has
jax==0.10.2 (the XLA torchtpu runs on): the --jax-python option, else $JAX_PYTHON, else
this interpreter when ``import jax`` works in it.
"""

from __future__ import annotations

import os
import subprocess
import sys

NO_JAX = "no jax in this python: pip install -e '.[jax]' (jax==0.10.2), or pass --jax-python / set JAX_PYTHON"


def jax_python(option: str | None = None) -> str | None:
    """The python for the JAX column, or None when there is none (the column is skipped)."""
    chosen = option or os.environ.get("JAX_PYTHON")
    if chosen:
        return chosen
    try:
        probe = subprocess.run([sys.executable, "-c", "import jax"], capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    return sys.executable if probe.returncode == 0 else None
