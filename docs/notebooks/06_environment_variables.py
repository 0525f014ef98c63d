"""Environment variables: every TORCHTPU_* setting, read from torchtpu.config, and a few in action.

marimo edit docs/notebooks/06_environment_variables.py
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(r"""
    # Environment variables

    torchtpu's settings are `TORCHTPU_*` environment variables, all declared in one table,
    `torchtpu.config.ENV_VARS` (name, default, meaning). They are read when needed, not
    once at import, but most matter at start-up: set them before launching Python (or
    before the first use of the device). The table below is generated from that module,
    so it lists exactly what this installed version knows.
    """)
    return (mo,)


@app.function
def md_table(headers: list[str], rows: list[list]) -> str:
    """A markdown table (for mo.md)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@app.cell
def _(mo):
    import json
    import os
    import subprocess
    import sys
    import tempfile
    import textwrap
    from pathlib import Path

    import torchtpu.config

    def _cell(text: str) -> str:
        return text.replace("|", "\\|") if text else "(empty)"

    _rows = [
        [f"`{v.name}`", f"`{_cell(v.default)}`", _cell(v.meaning), f"`{os.environ[v.name]}`" if v.name in os.environ else ""]
        for v in torchtpu.config.ENV_VARS.values()
    ]
    assert _rows and all(name.startswith("TORCHTPU_") for name in torchtpu.config.ENV_VARS)
    mo.md(
        md_table(["variable", "default", "meaning", "set in this process"], _rows)
        + "\n\nPyTorch's own `TORCH_DEVICE_BACKEND_AUTOLOAD` (default `1`) decides whether"
        " `import torch` loads torchtpu at all (see below)."
    )
    return Path, json, os, subprocess, sys, tempfile, textwrap


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Trying them out

    Each demonstration runs a small program in a fresh Python process with the variable
    set (the variables are read at start-up, and this keeps the notebook's own process
    untouched). The program computes `(x.sin() * 2 + 1).sum(0)` on tpu, checks it
    against the CPU, and reports the mode and the programs it compiled or loaded.
    Inherited `TORCHTPU_*` settings are removed first, so each run sees only its own.
    """)
    return


@app.cell
def _(json, os, subprocess, sys, textwrap):
    CHILD = """
    import json, torch, torchtpu
    x = torch.arange(6.0).reshape(2, 3)
    y = (x.to("tpu").sin() * 2 + 1).sum(0).cpu()
    torch.testing.assert_close(y, (x.sin() * 2 + 1).sum(0))
    m = torchtpu.metrics.snapshot()
    print(json.dumps({"mode": torchtpu.get_eager_mode(), "compiles": m["compiles"], "disk_cache_hits": m["disk_cache_hits"]}))
    """

    def run_child(code: str = CHILD, **env: str) -> tuple[dict, list[str]]:
        """Run ``code`` in a fresh process with ``env`` (and no inherited TORCHTPU_*
        variable): the JSON of its last stdout line, and the lines before it."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("TORCHTPU_")}
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], env={**base, **env}, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
        out = proc.stdout.strip().splitlines()
        return json.loads(out[-1]), out[:-1]

    return (run_child,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## `TORCHTPU_LOG_COMPILES=1` and `TORCHTPU_CACHE_DIR`

    `TORCHTPU_LOG_COMPILES=1` prints a line per program XLA compiles. In eager mode each
    op is its own program: four ops, four compilations.

    Every compiled program is stored under `TORCHTPU_CACHE_DIR` (default
    `~/.cache/torchtpu`, or `$XDG_CACHE_HOME/torchtpu`), keyed by the program's hash,
    the jaxlib version, the platform and the compile options. A second run of the same
    program loads its programs from there instead of compiling them (`disk_cache_hits`;
    nothing to log); processes sharing the directory (the ranks of one job) compile each
    program once. An empty value turns the cache off: every run compiles.

    Three runs, each with `TORCHTPU_LOG_COMPILES=1`: twice with the same new cache
    directory, then with the cache off.
    """)
    return


@app.cell
def _(Path, mo, run_child, tempfile):
    with tempfile.TemporaryDirectory() as _cache:
        _first, _first_log = run_child(TORCHTPU_LOG_COMPILES="1", TORCHTPU_CACHE_DIR=_cache)
        _second, _second_log = run_child(TORCHTPU_LOG_COMPILES="1", TORCHTPU_CACHE_DIR=_cache)
        _entries = sorted(p.relative_to(_cache).as_posix() for p in Path(_cache).rglob("*") if p.is_file())
    _off, _off_log = run_child(TORCHTPU_LOG_COMPILES="1", TORCHTPU_CACHE_DIR="")

    def _compiled(log: list[str]) -> list[str]:
        return [line for line in log if line.startswith("[torchtpu] compiled")]

    assert _first["mode"] == "eager"
    assert (_first["compiles"], _first["disk_cache_hits"], len(_compiled(_first_log))) == (4, 0, 4), (_first, _first_log)
    assert (_second["compiles"], _second["disk_cache_hits"], len(_compiled(_second_log))) == (0, 4, 0), _second
    assert len(_entries) == 4, _entries
    assert (_off["compiles"], _off["disk_cache_hits"], len(_compiled(_off_log))) == (4, 0, 4), _off
    mo.md(
        "First run, with a new cache directory:\n\n```\n"
        + "\n".join(_first_log)
        + "\n```\n\n"
        + md_table(
            ["run", "compiled", "loaded from the disk cache", "lines logged"],
            [
                ["new cache directory", _first["compiles"], _first["disk_cache_hits"], len(_compiled(_first_log))],
                ["same directory again", _second["compiles"], _second["disk_cache_hits"], len(_compiled(_second_log))],
                ['`TORCHTPU_CACHE_DIR=""`', _off["compiles"], _off["disk_cache_hits"], len(_compiled(_off_log))],
            ],
        )
        + "\n\nThe cache directory after the first run (one subdirectory per platform and jaxlib):\n\n"
        + "\n".join(f"- `{e}`" for e in _entries)
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## `TORCHTPU_DEFER_AND_FUSE=1`: start in DeferAndFuse mode

    The same program, unchanged, now records its four ops and runs them as one fused
    program when `.cpu()` needs the value (notebook 02 explains the modes).
    """)
    return


@app.cell
def _(mo, run_child, tempfile):
    with tempfile.TemporaryDirectory() as _cache:
        _result, _log = run_child(TORCHTPU_DEFER_AND_FUSE="1", TORCHTPU_LOG_COMPILES="1", TORCHTPU_CACHE_DIR=_cache)
    assert _result["mode"] == "defer_and_fuse", _result
    assert _result["compiles"] == 1 and len(_log) == 1 and "fused" in _log[0], (_log, _result)
    mo.md("```\n" + "\n".join(_log) + "\n```\n\n" + f"Reported by the child: `{_result}`")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## `TORCH_DEVICE_BACKEND_AUTOLOAD=0`: no autoload

    PyTorch's own switch. With it, `import torch` does not load torchtpu: the device
    string `"tpu"` is unknown until `import torchtpu`.
    """)
    return


@app.cell
def _(mo, run_child):
    _code = """
    import json, sys, torch
    loaded = "torchtpu" in sys.modules
    try:
        torch.zeros(2, device="tpu")
        error = None
    except RuntimeError as e:
        error = str(e)[:90]
    import torchtpu
    x = torch.ones(2, device="tpu") * 3
    print(json.dumps({"loaded_by_import_torch": loaded, "error_before": error, "after_import_torchtpu": x.cpu().tolist()}))
    """
    _result, _ = run_child(_code, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert _result["loaded_by_import_torch"] is False and _result["error_before"], _result
    assert _result["after_import_torchtpu"] == [3.0, 3.0]
    mo.md(
        md_table(
            ["", "result"],
            [
                ["`torchtpu` loaded by `import torch`", _result["loaded_by_import_torch"]],
                ['`torch.zeros(2, device="tpu")` before `import torchtpu`', f"`RuntimeError: {_result['error_before']}...`"],
                ['`torch.ones(2, device="tpu") * 3` after `import torchtpu`', _result["after_import_torchtpu"]],
            ],
        )
    )
    return


if __name__ == "__main__":
    app.run()
