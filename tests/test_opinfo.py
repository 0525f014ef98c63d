"""PyTorch's OpInfo database (op_db: core, linalg, fft, special, ...) run on tpu against
the CPU, one case per op x dtype x mode (``add-float32-fwd``, ``add-float32-grad``,
``add_-int64-inplace``, ``add-float64-out``).

``make test`` runs the bounded subset (``test_opinfo_quick``: float32 forward and
gradients, the first 2 samples of each op); ``make test-ops`` runs every dtype, mode and
sample (``test_opinfo``, marked slow). Expected failures and skips are data, with
reasons, in ``torchtpu/testing/expected_failures.py``. Each run writes its results to
``build/opinfo-<quick|full>.json`` (what ``python -m torchtpu.coverage --from`` reads).
"""

from __future__ import annotations

import os

import pytest
import torch

from torchtpu.testing import opinfo

QUICK_SAMPLES = 2
_RESULTS: dict[str, list[opinfo.Result]] = {"quick": [], "full": []}
_BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")

QUICK = opinfo.cases([torch.float32], ("fwd", "grad"))
FULL = opinfo.shard(opinfo.cases(None, opinfo.MODES), os.environ.get("TORCHTPU_OPINFO_SHARD"))
_SHARD_SUFFIX = os.environ.get("TORCHTPU_OPINFO_SHARD", "").replace("/", "of")


@pytest.fixture(scope="module", autouse=True)
def _write_results():
    yield
    os.makedirs(_BUILD, exist_ok=True)
    for name, results in _RESULTS.items():
        if results:
            suffix = f"-shard{_SHARD_SUFFIX}" if name == "full" and _SHARD_SUFFIX else ""
            opinfo.write_json(
                results, os.path.join(_BUILD, f"opinfo-{name}{suffix}.json"), {"description": f"tests/test_opinfo.py {name} run"}
            )


def _check(case: opinfo.Case, samples: int | None, bucket: str) -> None:
    r = opinfo.run_case(case, samples)
    _RESULTS[bucket].append(r)
    if r.status == "skip":
        pytest.skip(r.detail)
    if r.status == "xfail":
        pytest.xfail(r.detail)
    if r.status == "fail":
        pytest.fail(
            f"{r.kind}: {r.detail}\n(if this is expected, add {(r.op_id, r.dtype, r.mode)} to "
            "torchtpu/testing/expected_failures.py XFAIL with a specific reason)",
            pytrace=False,
        )


@pytest.mark.parametrize("case", QUICK, ids=[c.id for c in QUICK])
def test_opinfo_quick(case: opinfo.Case) -> None:
    _check(case, QUICK_SAMPLES, "quick")


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=[c.id for c in FULL])
def test_opinfo(case: opinfo.Case) -> None:
    _check(case, None, "full")


def test_expected_failure_keys_name_real_cases() -> None:
    """Every key of the expected-failure tables names an OpInfo entry, a dtype and a mode
    that exist (a typo would silently expect nothing)."""
    from torchtpu.testing import expected_failures as xf

    ids = {opinfo.op_id(op) for op in opinfo.op_db()}
    dtypes = {opinfo.dtype_name(d) for d in opinfo.PLATFORM_DTYPES}
    for table in (xf.XFAIL, xf.SKIP):
        for (op, dtype, mode), reason in table.items():
            assert op in ids, f"{op!r} is not an OpInfo entry"
            assert dtype is None or dtype in dtypes, f"{dtype!r} is not a platform dtype"
            assert mode is None or mode in opinfo.MODES, f"{mode!r} is not a mode"
            assert len(reason) > 12, f"{op}: give a specific reason"
