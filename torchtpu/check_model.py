"""Find what a model needs from torchtpu: run a script and report, per ATen op, whether it
ran lowered, decomposed, missing (no lowering: run on the CPU instead) or synced with the
host, with the source line of its first call.

    python -m torchtpu.check_model script.py [args...]

The script runs with ``TORCHTPU_CPU_FALLBACK=1`` so that a missing op does not stop it: every
op it would need is listed in one run. The report goes to stderr (after the script's own
output); the exit status is the script's. For any other run, ``TORCHTPU_OP_REPORT=1`` prints
the same report at exit.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def check_script(path: str, argv: list[str]) -> int:
    """Run ``path`` as ``__main__`` with ``argv``, print the op report; the script's exit status."""
    import torch  # noqa: F401 - loads the tpu device

    from . import op_report

    saved_fallback = os.environ.get("TORCHTPU_CPU_FALLBACK")
    os.environ["TORCHTPU_CPU_FALLBACK"] = "1"  # read per op: a missing op runs on the CPU
    recorder = op_report.start(cpu_fallback=True)
    status = 0
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as `python script.py` would
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - report what ran before the failure, then fail
        traceback.print_exc()
        status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        op_report.stop()
        if saved_fallback is None:
            del os.environ["TORCHTPU_CPU_FALLBACK"]
        else:
            os.environ["TORCHTPU_CPU_FALLBACK"] = saved_fallback
    sys.stdout.flush()
    print(recorder.format(), file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv else 2
    script = argv[0]
    if not os.path.isfile(script):
        print(f"torchtpu.check_model: no such script: {script}", file=sys.stderr)
        return 2
    return check_script(script, argv[1:])


if __name__ == "__main__":
    sys.exit(main())
