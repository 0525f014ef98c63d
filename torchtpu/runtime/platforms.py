"""Which PjRT platform to start, and the checks that must happen before XLA sees anything.

No jaxlib here: this module decides; ``pjrt.py`` acts.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import config
from ..errors import TpuPlatformError

PLATFORMS = ("cpu", "tpu", "cuda")


@dataclass(frozen=True)
class PlatformChoice:
    name: str  # cpu | tpu | cuda
    plugin_path: str | None  # the PjRT C-API plugin for tpu/cuda
    explicit: bool  # the user asked for it through TORCHTPU_PLATFORM


def _package_file(package: str, *names: str) -> str | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        for name in names:
            path = Path(loc) / name
            if path.exists():
                return str(path)
    return None


def libtpu_path() -> str | None:
    explicit = config.get("TORCHTPU_LIBTPU_PATH") or os.environ.get("TPU_LIBRARY_PATH")
    if explicit:
        return explicit
    return _package_file("libtpu", "libtpu.so")


def cuda_plugin_path() -> str | None:
    explicit = config.get("TORCHTPU_CUDA_PLUGIN_PATH")
    if explicit:
        return explicit
    for pkg in ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"):
        path = _package_file(pkg, "xla_cuda_plugin.so")
        if path:
            return path
    return None


def choose() -> PlatformChoice:
    want = config.get("TORCHTPU_PLATFORM").strip().lower()
    if want:
        if want not in PLATFORMS:
            raise TpuPlatformError(
                f"TORCHTPU_PLATFORM={want!r} is not a platform torchtpu knows; use one of {', '.join(PLATFORMS)} "
                "or leave it unset to pick the best installed one."
            )
        path = {"cpu": None, "tpu": libtpu_path(), "cuda": cuda_plugin_path()}[want]
        if want != "cpu" and path is None:
            hint = (
                "pip install libtpu (on a TPU VM) or set TORCHTPU_LIBTPU_PATH"
                if want == "tpu"
                else "pip install jax-cuda12-pjrt==0.10.2 (matching jaxlib) or set TORCHTPU_CUDA_PLUGIN_PATH"
            )
            raise TpuPlatformError(f"TORCHTPU_PLATFORM={want} but its PjRT plugin was not found: {hint}.")
        return PlatformChoice(want, path, True)
    for name, finder in (("tpu", libtpu_path), ("cuda", cuda_plugin_path)):
        path = finder()
        if path:
            return PlatformChoice(name, path, False)
    return PlatformChoice("cpu", None, False)


# --- XLA_FLAGS -------------------------------------------------------------
# XLA parses XLA_FLAGS once, at the first client, and an unknown flag aborts the
# whole process (a C++ LOG(FATAL)). We try the flags in a child process first so
# that a typo becomes a Python exception instead of killing the user's program.
_verified_flags: set[str] = set()

_PROBE = (
    "import sys, importlib.abc\n"
    "from jaxlib import xla_client as xc\n"
    "xc.make_cpu_client(asynchronous=False)\n"
    "print('ok')\n"
)


def verify_xla_flags() -> None:
    flags = os.environ.get("XLA_FLAGS", "").strip()
    if not flags or flags in _verified_flags or not config.flag("TORCHTPU_VERIFY_XLA_FLAGS"):
        return
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=120,
    )
    if proc.returncode != 0 or "ok" not in proc.stdout:
        detail = [ln for ln in proc.stderr.splitlines() if "flag" in ln.lower()] or proc.stderr.splitlines()[-3:]
        raise TpuPlatformError(
            f"XLA rejected XLA_FLAGS={flags!r}: {' | '.join(detail).strip()}. "
            "Fix or unset XLA_FLAGS (XLA aborts the process on an unknown flag, so torchtpu checked it first; "
            "set TORCHTPU_VERIFY_XLA_FLAGS=0 to skip this check)."
        )
    _verified_flags.add(flags)
