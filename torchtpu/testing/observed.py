"""How a conformance case fails: the record the harness makes of each failing sample, and
the recorded signature an expected failure must keep matching.

An expected failure is a claim that a difference is acceptable, so it is held to what was
measured: the samples that fail, the kind of failure, and (for wrong values) how far the
values are from the CPU's. A case listed in ``expected_failures_full.OBSERVED`` fails the
run when it fails in another way, on another sample, or by more than ``GROWTH`` times the
recorded error; and when it passes entirely (strict xpass).
"""

from __future__ import annotations

from dataclasses import dataclass

# A recorded error bound may grow this much before the failure counts as a new one: XLA's
# CPU code generation depends on the host (AVX-512 or AVX2), which moves rounding-level
# differences by an ulp or so; a wrong value moves them by orders of magnitude.
GROWTH = 2.0

# Kinds of failure, in the order a report lists them.
KINDS = ("missing", "accepted", "error", "message", "meta", "mismatch")


@dataclass
class SampleFailure:
    """One sample that failed: how, and for wrong values by how much.

    ``kind``: ``missing`` (NotImplementedError: no lowering), ``error`` (any other
    exception; for an error input, an exception of another type than the CPU's),
    ``accepted`` (an error input the CPU refuses returns a result on tpu), ``message``
    (an error input raises the CPU's type with a message not matching OpInfo's), ``meta`` (shapes, dtypes, devices or structure differ from the CPU's),
    ``mismatch`` (values differ beyond the tolerance and the tpu result is farther from
    the float64 reference than the CPU's, or there is no float64 reference).
    ``tpu_f64``/``cpu_f64``: the summed absolute error of each result against the sample
    run in float64 on the CPU (PyTorch's ``_ref_test_helper`` distance), when computed.
    """

    index: int
    kind: str
    detail: str
    where: str = ""
    mismatched: int = 0
    total: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    tpu_f64: float | None = None
    cpu_f64: float | None = None


@dataclass(frozen=True)
class Observed:
    """The recorded signature of a failing case (``expected_failures_full.OBSERVED``).

    ``samples``: indices (in ``sample_inputs`` order, seeded) of the samples that fail.
    ``error``: for ``missing``/``error``/``meta``, the start every failure's message shares.
    ``max_abs``/``max_rel``: for ``mismatch``, the largest differences from the CPU measured.
    """

    kind: str
    samples: tuple[int, ...]
    error: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0

    def accepts(self, f: SampleFailure) -> str | None:
        """None when ``f`` is this failure; else what changed, in words."""
        if f.index not in self.samples:
            return f"sample {f.index} fails ({f.kind}), which the entry does not list (it lists {list(self.samples)})"
        if f.kind != self.kind:
            return f"sample {f.index} fails as {f.kind!r}, recorded as {self.kind!r}"
        if self.kind != "mismatch":
            if not f.detail.startswith(self.error):
                return f"sample {f.index} fails with {f.detail[:160]!r}, recorded as {self.error!r}"
            return None
        if f.max_abs > self.max_abs * GROWTH and f.max_rel > self.max_rel * GROWTH:
            return (
                f"sample {f.index} differs from the CPU by {f.max_abs:.3g} abs / {f.max_rel:.3g} rel, recorded "
                f"{self.max_abs:.3g} / {self.max_rel:.3g} (the error grew)"
            )
        return None


@dataclass(frozen=True)
class Verdict:
    status: str  # pass | fail | xfail | xpass | skip
    detail: str


# A case's entry: one signature, or one per kind when its samples fail in different ways.
Entry = Observed | tuple[Observed, ...]


def signatures(entry: Entry | None) -> tuple[Observed, ...]:
    if entry is None:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def _accepts(entry: tuple[Observed, ...], f: SampleFailure) -> str | None:
    listing = [o for o in entry if f.index in o.samples]
    return listing[0].accepts(f) if listing else entry[0].accepts(f)


def judge(failures: list[SampleFailure], ran: range, entry: Entry | None, reason: str | None) -> Verdict:
    """Hold the failures of one case (samples ``ran`` were run) to its expected failure."""
    sigs = signatures(entry)
    listed_here = sorted(i for o in sigs for i in o.samples if i in ran)
    if not failures:
        if listed_here:
            return Verdict(
                "xpass",
                f"passes, but is listed as failing on samples {listed_here}: "
                "remove it (python -m torchtpu.testing.record_failures)",
            )
        return Verdict("pass", "")
    first = failures[0]
    summary = f"{len(failures)} sample(s) fail, first #{first.index} {first.kind}: {first.detail}"
    if not sigs:
        return Verdict("fail", summary)
    changed = [c for c in (_accepts(sigs, f) for f in failures) if c]
    if changed:
        return Verdict("fail", f"the expected failure changed: {changed[0]} | {summary}")
    if reason is None:
        return Verdict("fail", f"listed in OBSERVED but no reason in expected_failures.XFAIL says why | {summary}")
    return Verdict("xfail", f"{reason} [{summary}]")


def common_error(details: list[str]) -> str:
    """The start every failure message shares (at least the exception's type)."""
    first = details[0]
    n = len(first)
    for d in details[1:]:
        n = min(n, next((i for i, (a, b) in enumerate(zip(first, d)) if a != b), min(len(first), len(d))))
    return first[:n][:200]


def entry_from(failures: list[SampleFailure]) -> Entry:
    """The entry to record for a case that fails with ``failures``: one signature per kind."""
    kinds = sorted({f.kind for f in failures}, key=KINDS.index)
    sigs = tuple(_signature(kind, [f for f in failures if f.kind == kind]) for kind in kinds)
    return sigs[0] if len(sigs) == 1 else sigs


def _signature(kind: str, same: list[SampleFailure]) -> Observed:
    if kind == "mismatch":
        return Observed(
            kind,
            tuple(f.index for f in same),
            max_abs=max(f.max_abs for f in same),
            max_rel=max(f.max_rel for f in same),
        )
    return Observed(kind, tuple(f.index for f in same), error=common_error([f.detail for f in same]))
