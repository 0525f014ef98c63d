"""Every TORCHTPU_* environment variable, its default and meaning, in one table.

Values are read when asked for (not cached at import), so tests can set them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    meaning: str


ENV_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in [
        EnvVar("TORCHTPU_PLATFORM", "", "PjRT platform: cpu, tpu or cuda. Empty: the best installed one."),
        EnvVar("TORCHTPU_CPU_FALLBACK", "0", "1: run ops without a lowering on the host (warns once per op)."),
        EnvVar("TORCHTPU_LIBTPU_PATH", "", "Path to libtpu.so for the tpu platform (default: the libtpu package)."),
        EnvVar("TORCHTPU_CUDA_PLUGIN_PATH", "", "Path to the CUDA PjRT plugin .so (default: the jax-cuda*-pjrt package)."),
        EnvVar("TORCHTPU_VERIFY_XLA_FLAGS", "1", "1: check XLA_FLAGS in a child process before the client reads them."),
        EnvVar("TORCHTPU_LOG_COMPILES", "0", "1: print one line per compiled program (op, shapes, milliseconds)."),
        EnvVar(
            "TORCHTPU_COLLECTIVES",
            "",
            "Transport of the 'tpu' process group: xla (collectives as XLA programs) or host (gloo on host copies). "
            "Empty: host on the cpu platform, xla on tpu and cuda.",
        ),
        EnvVar(
            "TORCHTPU_DIST_CHECK",
            "1",
            "1: before each collective, check that all ranks called the same one with matching tensors, and that "
            "every rank compiled a program with collectives alike.",
        ),
        EnvVar(
            "TORCHTPU_CACHE_DIR",
            "~/.cache/torchtpu",
            "Persistent compilation cache directory ($XDG_CACHE_HOME/torchtpu by default); empty disables it.",
        ),
        EnvVar("TORCHTPU_LOG_RECOMPILES", "0", "1: print why torch.compile needed a new program."),
        EnvVar(
            "TORCHTPU_MAX_EXECUTABLES",
            "4096",
            "Live compiled programs kept in memory (least recently used dropped beyond it; reloaded from the disk cache).",
        ),
        EnvVar(
            "TORCHTPU_MAX_PROGRAMS",
            "4096",
            "Entries kept in each host-side program cache (eager op programs, DeferAndFuse op specs and graphs, each "
            "compiled graph's programs, device scalars, the array types handed to PjRT); least recently used dropped beyond it and rebuilt when needed.",
        ),
        EnvVar("TORCHTPU_DUMP_DIR", "", "Directory to write each compiled program's StableHLO (and its FX graph) to."),
        EnvVar("TORCHTPU_DEFER_AND_FUSE", "0", "1: start in DeferAndFuse eager mode (record ops, run fused programs)."),
        EnvVar("TORCHTPU_LAUNCH_BLOCKING", "0", "1: run every op synchronously; errors name the op and source line."),
        EnvVar(
            "TORCHTPU_OP_REPORT",
            "0",
            "1: record how every op ran (lowered, decomposed, missing, host sync) and print the report at exit.",
        ),
        EnvVar(
            "TORCHTPU_EXPLAIN",
            "0",
            "1: record why each program was compiled, every host sync and CPU fallback; print torchtpu.debug.explain()'s report at exit.",
        ),
    ]
}


def get(name: str) -> str:
    var = ENV_VARS[name]
    return os.environ.get(name, var.default)


def flag(name: str) -> bool:
    return get(name).strip().lower() in ("1", "true", "yes", "on")
