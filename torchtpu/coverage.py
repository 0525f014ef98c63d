"""Op coverage report: core ATen overloads lowered / decomposed / missing, and the OpInfo
conformance results per mode and dtype.

    python -m torchtpu.coverage                      # core table + quick OpInfo run (float32)
    python -m torchtpu.coverage --full               # every dtype, mode and sample (slow)
    python -m torchtpu.coverage --from build/opinfo.json --markdown docs/coverage.md
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

# Core overloads served by the runtime kernels (allocation, scalar read-back, resizing) or
# answered from tensor metadata by PyTorch itself: they never reach the lowering registry.
RUNTIME_CORE = {
    "aten._local_scalar_dense.default": "runtime kernel (eager/minimal.py): reads the value back",
    "aten.empty.memory_format": "runtime kernel (eager/minimal.py): allocation",
    "aten.empty_strided.default": "runtime kernel (eager/minimal.py): allocation",
    "aten.resize_.default": "runtime kernel (eager/minimal.py): resizes the storage cell",
    "aten.nonzero.default": "host-synced kernel (eager/host_ops.py): data-dependent output shape",
    "aten.sym_size.int": "metadata query answered by PyTorch from the tensor's sizes",
    "aten.sym_stride.int": "metadata query answered by PyTorch from the tensor's strides",
    "aten.sym_numel.default": "metadata query answered by PyTorch from the tensor's sizes",
    "aten.sym_storage_offset.default": "metadata query answered by PyTorch from the tensor",
    "aten.sym_is_contiguous.default": "metadata query answered by PyTorch from the tensor",
}


@dataclass
class CoreEntry:
    op: str
    status: str  # lowered | decomposed | runtime | expected-missing | missing
    how: str


def core_overloads() -> list[torch._ops.OpOverload]:
    """Every aten overload tagged ``torch.Tag.core`` in this PyTorch, sorted by name."""
    out = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        name, _, overload = qualified[6:].partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, name), overload or "default")
        except AttributeError:
            continue
        if torch.Tag.core in op.tags:
            out.append(op)
    return sorted(out, key=str)


def classify_core(op: torch._ops.OpOverload) -> CoreEntry:
    from .eager.plan import functional_variant
    from .lowering import registry
    from .lowering.decomp import OWN, _pytorch_tables, decomposition_for
    from .testing.expected_failures import CORE_MISSING

    registry._load_rules()
    name = str(op)
    if op in registry.RULES:
        return CoreEntry(
            name, "lowered", f"rule {registry.RULES[op].__module__.rsplit('.', 1)[-1]}.{registry.RULES[op].__name__}"
        )
    if name in RUNTIME_CORE:
        return CoreEntry(name, "runtime", RUNTIME_CORE[name])
    fop = functional_variant(op)
    if fop is not None and fop is not op and fop in registry.RULES:
        return CoreEntry(name, "lowered", f"functional variant {fop} has a rule")
    if decomposition_for(op) is not None:
        core, full = _pytorch_tables()
        src = (
            "own (lowering/decomp.py)"
            if op in OWN
            else "torch._decomp core table"
            if op in core
            else "torch._decomp table"
            if op in full
            else "CompositeImplicitAutograd kernel"
            if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
            else "CompositeExplicitAutograd kernel (eager's)"
        )
        return CoreEntry(name, "decomposed", src)
    if name in CORE_MISSING:
        return CoreEntry(name, "expected-missing", CORE_MISSING[name])
    return CoreEntry(name, "missing", "no rule, no decomposition, not listed in expected_failures.CORE_MISSING")


def core_table() -> list[CoreEntry]:
    return [classify_core(op) for op in core_overloads()]


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
def _core_lines(entries: list[CoreEntry], md: bool) -> list[str]:
    counts = collections.Counter(e.status for e in entries)
    order = ["lowered", "decomposed", "runtime", "expected-missing", "missing"]
    lines = [f"Core ATen overloads (torch.Tag.core, torch {torch.__version__}): {len(entries)}", ""]
    if md:
        lines = ["## Core ATen opset", "", lines[0], "", "| status | count |", "|---|---|"]
        lines += [f"| {s} | {counts.get(s, 0)} |" for s in order]
        lines += ["", "| overload | status | how |", "|---|---|---|"]
        lines += [f"| `{e.op}` | {e.status} | {e.how} |" for e in entries if e.status != "lowered"]
        lines.append("")
        return lines
    lines += [f"  {s:<17}{counts.get(s, 0):>5}" for s in order]
    lines += ["", "  not lowered directly:"]
    lines += [f"    {e.op:<42} {e.status:<17} {e.how}" for e in entries if e.status != "lowered"]
    lines.append("")
    return lines


STATUSES = ("pass", "xpass", "fail", "xfail", "skip")


def _opinfo_lines(results: list[Any], md: bool) -> list[str]:
    by = collections.defaultdict(collections.Counter)
    for r in results:
        by[(r.mode, r.dtype)][r.status] += 1
    head = ["mode", "dtype", "entries", *STATUSES, "pass %"]
    rows = []
    for (mode, dtype), c in sorted(by.items(), key=lambda kv: (["fwd", "grad", "inplace", "out"].index(kv[0][0]), kv[0][1])):
        total = sum(c.values())
        passing = c["pass"] + c["xpass"]
        rows.append([mode, dtype, str(total), *(str(c[s]) for s in STATUSES), f"{100.0 * passing / total:.1f}"])
    if md:
        lines = ["## OpInfo conformance (tpu vs CPU)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        lines = ["OpInfo conformance (tpu vs CPU):", "  " + "".join(f"{h:>9}" for h in head)]
        lines += ["  " + "".join(f"{x:>9}" for x in r) for r in rows]
    lines += _kind_lines(results, md) + _refereed_lines(results, md)
    bad = [r for r in results if r.status in ("fail", "xfail", "xpass")]
    if bad:
        lines += ["", "### Failures and expected failures" if md else "", ""]
        if md:
            lines += ["| case | status | reason |", "|---|---|---|"]
            lines += [f"| `{r.op_id}-{r.dtype}-{r.mode}` | {r.status} | {_md(r.detail)} |" for r in bad]
        else:
            lines += [f"  {r.op_id}-{r.dtype}-{r.mode:<8} {r.status:<6} {r.detail[:160]}" for r in bad]
    lines.append("")
    return lines


def _kind_lines(results: list[Any], md: bool) -> list[str]:
    """Expected failures and failures by kind (missing lowering, error, metadata, values)."""
    counts = collections.Counter((r.status, r.kind) for r in results if r.status in ("fail", "xfail"))
    if not counts:
        return []
    head = ["", "### Failing cases by kind" if md else "Failing cases by kind:", ""]
    if md:
        rows = ["| status | kind | cases |", "|---|---|---|"]
        return head + rows + [f"| {s} | {k} | {n} |" for (s, k), n in sorted(counts.items())]
    return head + [f"  {s:<6} {k:<9} {n:>5}" for (s, k), n in sorted(counts.items())]


def _refereed_lines(results: list[Any], md: bool) -> list[str]:
    """The cases with samples that differ from the CPU beyond the tolerance but are at least
    as close to the float64 result as the CPU's (so they pass)."""
    refereed = [r for r in results if getattr(r, "refereed", None)]
    if not refereed:
        return []
    n = sum(len(r.refereed) for r in refereed)
    title = f"Passed by the float64 referee: {n} samples in {len(refereed)} cases"
    lines = ["", f"### {title}" if md else title + ":", ""]
    if md:
        lines += ["| case | samples | max abs diff vs CPU | summed error vs float64: tpu / CPU |", "|---|---|---|---|"]
    for r in refereed:
        worst = max(r.refereed, key=lambda x: x["max_abs"])
        cells = [
            f"`{r.op_id}-{r.dtype}-{r.mode}`" if md else f"{r.op_id}-{r.dtype}-{r.mode}",
            str(len(r.refereed)),
            f"{worst['max_abs']:.3g}",
            f"{worst['tpu_f64']:.3g} / {worst['cpu_f64']:.3g}",
        ]
        lines.append("| " + " | ".join(cells) + " |" if md else "  " + "  ".join(cells))
    return lines


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")[:240]


def render(entries: list[CoreEntry], results: list[Any] | None, md: bool, meta: dict[str, Any] | None = None) -> str:
    lines = ["# torchtpu op coverage", ""] if md else []
    if meta:
        lines += [f"OpInfo run: {meta.get('description', '')}", ""]
    lines += _core_lines(entries, md)
    if results:
        lines += _opinfo_lines(results, md)
    return "\n".join(lines)


def run_opinfo(
    full: bool, dtypes: Iterable[torch.dtype] | None, samples: int | None, verbose: bool
) -> tuple[list[Any], dict[str, Any]]:
    from .testing import opinfo

    modes = opinfo.MODES if full else ("fwd", "grad")
    if dtypes is None and not full:
        dtypes = [torch.float32]
    selected = opinfo.cases(dtypes, modes)
    t0 = time.perf_counter()

    def progress(r: Any) -> None:
        if verbose and r.status in ("fail", "xpass"):
            print(f"  {r.status}: {r.op_id}-{r.dtype}-{r.mode}: {r.detail[:200]}", file=sys.stderr)

    results = opinfo.run_all(selected, samples, progress)
    desc = f"modes {','.join(modes)}; dtypes {'all platform dtypes' if dtypes is None else ','.join(map(opinfo.dtype_name, dtypes))}; samples per case {samples or 'all'}; {time.perf_counter() - t0:.0f} s"
    return results, {"description": desc}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torchtpu.coverage", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--full", action="store_true", help="every dtype, mode (fwd, grad, inplace, out) and sample")
    p.add_argument("--dtypes", help="comma-separated dtypes (default: float32, or all with --full)")
    p.add_argument("--samples", type=int, default=None, help="samples per case (default: 2, or all with --full)")
    p.add_argument("--no-opinfo", action="store_true", help="only the core opset table")
    p.add_argument("--from", dest="from_json", help="read OpInfo results from this JSON instead of running")
    p.add_argument("--json", help="write the OpInfo results to this JSON")
    p.add_argument("--markdown", help="also write the report as markdown to this file")
    p.add_argument("-v", "--verbose", action="store_true", help="print failures as they happen")
    a = p.parse_args(argv)

    from .testing import opinfo

    entries = core_table()
    results, meta = None, None
    if a.from_json:
        meta, results = opinfo.read_json(a.from_json)
    elif not a.no_opinfo:
        dtypes = [getattr(torch, d) for d in a.dtypes.split(",")] if a.dtypes else None
        samples = a.samples if a.samples is not None else (None if a.full else 2)
        results, meta = run_opinfo(a.full, dtypes, samples, a.verbose)
        if a.json:
            opinfo.write_json(results, a.json, meta)
    print(render(entries, results, md=False, meta=meta))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(render(entries, results, md=True, meta=meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
