"""The full OpInfo conformance run in pieces that survive an interruption.

    python -m torchtpu.testing.resumable run [--part I/N]   # append results, skip cases done
    python -m torchtpu.testing.resumable merge               # build/opinfo-full.json + a summary
    python -m torchtpu.testing.resumable summary             # expected failures by reason, float64-refereed cases

``make test-ops`` runs every case in one go (hours on a 2-core machine). This runs the same
cases (every op, dtype, mode and sample) one at a time and appends each result as a JSON
line to ``build/opinfo-full.jsonl.<part>``, so a run that is stopped resumes where it
stopped, and N processes (``--part 0/2``, ``--part 1/2``) share the cases (interleaved:
the slow ops sit together in op_db's order). A result is as good as the code that produced
it: after a change to the backend, delete the lines of the cases it can affect, or
``--rerun-failing`` to run again every case that failed or was expected to fail.
``merge`` writes the latest result of each case to ``build/opinfo-full.json``, the input of
``python -m torchtpu.testing.record_failures`` and ``python -m torchtpu.coverage``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from . import opinfo
from .shards import BUILD

PREFIX = os.path.join(BUILD, "opinfo-full.jsonl")


def _lines() -> dict[str, dict[str, Any]]:
    """The latest recorded result of each case, by case id (files in name order: the
    reruns, named ``...rerun``, come last)."""
    latest: dict[str, dict[str, Any]] = {}
    for path in sorted(glob.glob(PREFIX + "*")):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # the last line of a run killed mid-write
                    continue
                latest[row["case_id"]] = row
    return latest


def _part(spec: str) -> tuple[int, int]:
    i, n = (int(x) for x in spec.split("/"))
    if not 0 <= i < n:
        raise SystemExit(f"--part {spec}: want I/N with 0 <= I < N")
    return i, n


def run(part: str, rerun_failing: bool) -> int:
    import torch

    from ..runner import checks

    latest = _lines()
    if rerun_failing:
        todo = {k for k, r in latest.items() if r["status"] in ("fail", "xfail", "xpass")}
        cases = [c for c in opinfo.cases(None, opinfo.MODES) if c.id in todo]
        out = PREFIX + ".rerun"
    else:
        cases = [c for c in opinfo.cases(None, opinfo.MODES) if c.id not in latest]
        out = f"{PREFIX}.{part.replace('/', 'of')}"
    i, n = _part(part)
    cases = cases[i::n]
    print(f"{len(latest)} cases recorded, {len(cases)} to run in part {part}", flush=True)
    os.makedirs(BUILD, exist_ok=True)
    with open(out, "a") as f:
        for case in cases:
            torch.manual_seed(0)
            result = opinfo.run_case(case)
            checks.clear()  # a device-side error this case left is not the next one's
            f.write(json.dumps(dict(asdict(result), case_id=case.id)) + "\n")
            f.flush()
            if result.status in ("fail", "xpass"):
                print(f"{result.status.upper()} {case.id}: {result.detail[:300]}", flush=True)
    return 0


def merge() -> int:
    latest = _lines()
    fields = set(opinfo.Result.__dataclass_fields__)
    results = [opinfo.Result(**{k: v for k, v in r.items() if k in fields}) for r in latest.values()]
    total = len(opinfo.cases(None, opinfo.MODES))
    path = os.path.join(BUILD, "opinfo-full.json")
    opinfo.write_json(results, path, {"description": f"OpInfo conformance: {len(results)} of {total} cases (resumable run)"})
    by_mode: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in results:
        by_mode[r.mode][r.status] += 1
    print(f"{path}: {len(results)} of {total} cases; {dict(collections.Counter(r.status for r in results))}")
    for mode, counts in sorted(by_mode.items()):
        print(f"  {mode:9s} {dict(counts)}")
    for r in results:
        if r.status in ("fail", "xpass"):
            print(f"{r.status.upper()} {r.op_id}-{r.dtype}-{r.mode}: {r.detail[:300]}")
    return 0


def _reason_names() -> dict[str, str]:
    """expected_failures' reason texts by their names (_TIES, ...), for the summary."""
    from . import expected_failures as xf

    return {v: k for k, v in vars(xf).items() if k.startswith("_") and isinstance(v, str)}


def summary() -> int:
    """The recorded cases by status, the expected failures by reason, and the cases whose
    differing samples the float64 referee passed (written to build/opinfo-refereed.txt)."""
    from . import expected_failures as xf

    rows = list(_lines().values())
    names = _reason_names()
    print(f"{len(rows)} cases: {dict(collections.Counter(r['status'] for r in rows))}")
    reasons = collections.Counter(
        names.get(reason, "(combined) " + reason[:50])
        for r in rows
        if r["status"] == "xfail" and (reason := xf.lookup(xf.XFAIL, r["op_id"], r["dtype"], r["mode"]))
    )
    for name, n in reasons.most_common():
        print(f"  {n:4d} xfail {name}")
    refereed = sorted((r for r in rows if r["refereed"]), key=lambda r: r["case_id"])
    path = os.path.join(BUILD, "opinfo-refereed.txt")
    with open(path, "w") as f:
        for r in refereed:
            tpu, cpu = sum(x["tpu_f64"] for x in r["refereed"]), sum(x["cpu_f64"] for x in r["refereed"])
            f.write(
                f"{r['case_id']} [{r['status']}]: {len(r['refereed'])} sample(s), summed error against float64 tpu {tpu:.3g}, CPU {cpu:.3g}\n"
            )
    print(f"{path}: {len(refereed)} cases, {sum(len(r['refereed']) for r in refereed)} samples passed by the float64 referee")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchtpu.testing.resumable", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the cases not recorded yet")
    r.add_argument("--part", default="0/1", help="I/N: every N-th remaining case from the I-th")
    r.add_argument("--rerun-failing", action="store_true", help="run again the cases recorded as failing or xfail")
    sub.add_parser("merge", help="write build/opinfo-full.json from the recorded lines")
    sub.add_parser("summary", help="expected failures by reason and the float64-refereed cases")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.part, args.rerun_failing)
    if args.command == "summary":
        return summary()
    return merge()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
