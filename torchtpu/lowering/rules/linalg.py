"""Linear algebra: native StableHLO where it exists (cholesky, triangular_solve), LAPACK
through XLA's CPU custom calls for the rest (getrf: LU/solve/inv/det; geqrf+orgqr: QR;
gesdd: SVD; syevd/heevd: eigh).

The LAPACK calls are XLA's typed-FFI LAPACK handlers (``lapack_sgetrf_ffi`` ...), registered
with the CPU client by ``runtime/pjrt.py``. They read column-major matrices, which the
``operand_layouts``/``result_layouts`` attributes ask XLA to provide; leading dims are a
batch. Only XLA's CPU client has them: on tpu/cuda these ops raise NotImplementedError.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...runtime import pjrt
from ...stablehlo.builder import Value
from ...stablehlo.types import is_complex
from ..context import NodeLowering
from ..registry import register
from .complex import conj, part_dtype
from .view import _tri

aten = torch.ops.aten

_PREFIX = {torch.float32: "s", torch.float64: "d", torch.complex64: "c", torch.complex128: "z"}
_ORGQR = {"s": "sorgqr", "d": "dorgqr", "c": "cungqr", "z": "zungqr"}
_SYEVD = {"s": "ssyevd", "d": "dsyevd", "c": "cheevd", "z": "zheevd"}


# -- custom-call plumbing --------------------------------------------------------------
def _lapack(L: NodeLowering, routine: str, dtype: torch.dtype) -> str:
    """The FFI target for ``routine`` (e.g. "getrf") in ``dtype``; raises where unavailable."""
    what = L.op.name() if L.op is not None else routine
    rt = pjrt.get()
    if not getattr(rt, "has_lapack", False):
        raise NotImplementedError(
            f"torchtpu: '{what}' needs LAPACK, which XLA provides only on the cpu platform "
            f"(this process runs on {rt.platform}); compute it on the CPU with .cpu() and move the result back"
        )
    if dtype not in _PREFIX:
        raise NotImplementedError(
            f"torchtpu: '{what}' supports float32, float64, complex64 and complex128, not {dtype}; convert the input first"
        )
    p = _PREFIX[dtype]
    name = {"orgqr": _ORGQR[p], "syevd": _SYEVD[p]}.get(routine, p + routine)
    return f"lapack_{name}_ffi"


def _matrix_layout(rank: int) -> list[int]:
    """Minor-to-major layout of a column-major batch of matrices."""
    return [rank - 2, rank - 1, *range(rank - 3, -1, -1)]


def _row_major(rank: int) -> list[int]:
    return list(range(rank - 1, -1, -1))


def _char(c: str) -> str:
    return f"{ord(c)} : ui8"


def getrf(L: NodeLowering, a: Value) -> tuple[Value, Value, Value]:
    """LU with partial pivoting: (packed LU, 1-based int32 pivots, int32 info)."""
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    k = min(m, n)
    lu, piv, info = L.b.custom_call(
        _lapack(L, "getrf", a.dtype),
        [a],
        [(a.shape, a.dtype), (batch + (k,), torch.int32), (batch, torch.int32)],
        operand_layouts=[_matrix_layout(a.rank)],
        result_layouts=[_matrix_layout(a.rank), _row_major(len(batch) + 1), _row_major(len(batch))],
        aliases={0: 0},
    )
    return lu, piv, info


def geqrf(L: NodeLowering, a: Value) -> tuple[Value, Value]:
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    qr, tau = L.b.custom_call(
        _lapack(L, "geqrf", a.dtype),
        [a],
        [(a.shape, a.dtype), (batch + (min(m, n),), a.dtype)],
        operand_layouts=[_matrix_layout(a.rank)],
        result_layouts=[_matrix_layout(a.rank), _row_major(len(batch) + 1)],
        aliases={0: 0},
    )
    return qr, tau


def orgqr(L: NodeLowering, a: Value, tau: Value) -> Value:
    (q,) = L.b.custom_call(
        _lapack(L, "orgqr", a.dtype),
        [a, tau],
        [(a.shape, a.dtype)],
        operand_layouts=[_matrix_layout(a.rank), _row_major(tau.rank)],
        result_layouts=[_matrix_layout(a.rank)],
        aliases={0: 0},
    )
    return q


def gesdd(L: NodeLowering, a: Value, full: bool, compute_uv: bool) -> tuple[Value, Value, Value, Value]:
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    k = min(m, n)
    mode = "A" if full and compute_uv else ("S" if compute_uv else "N")
    u_shape = batch + ((m, m) if mode == "A" else (m, k))
    vt_shape = batch + ((n, n) if mode == "A" else (k, n))
    lay = _matrix_layout(a.rank)
    _, s, u, vt, info = L.b.custom_call(
        _lapack(L, "gesdd", a.dtype),
        [a],
        [(a.shape, a.dtype), (batch + (k,), part_dtype(a.dtype) if is_complex(a.dtype) else a.dtype), (u_shape, a.dtype), (vt_shape, a.dtype), (batch, torch.int32)],
        config={"mode": _char(mode)},
        operand_layouts=[lay],
        result_layouts=[lay, _row_major(len(batch) + 1), lay, lay, _row_major(len(batch))],
        aliases={0: 0},
    )
    return s, u, vt, info


def syevd(L: NodeLowering, a: Value, lower: bool, vectors: bool) -> tuple[Value, Value, Value]:
    batch, n = a.shape[:-2], a.shape[-1]
    real = part_dtype(a.dtype) if is_complex(a.dtype) else a.dtype
    v, w, info = L.b.custom_call(
        _lapack(L, "syevd", a.dtype),
        [a],
        [(a.shape, a.dtype), (batch + (n,), real), (batch, torch.int32)],
        config={"mode": _char("V" if vectors else "N"), "uplo": _char("L" if lower else "U")},
        operand_layouts=[_matrix_layout(a.rank)],
        result_layouts=[_matrix_layout(a.rank), _row_major(len(batch) + 1), _row_major(len(batch))],
        aliases={0: 0},
    )
    return w, v, info


# -- small helpers ---------------------------------------------------------------------
def _mT(L: NodeLowering, x: Value) -> Value:
    perm = list(range(x.rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return L.b.transpose(x, perm)


def _mH(L: NodeLowering, x: Value) -> Value:
    return conj(L, _mT(L, x))


def _bcast_batch(L: NodeLowering, x: Value, batch: Sequence[int], core: int) -> Value:
    """Broadcast ``x``'s leading dims to ``batch`` (its last ``core`` dims stay)."""
    return L.broadcast_to(x, tuple(batch) + x.shape[x.rank - core :])


def _nan_where_failed(L: NodeLowering, x: Value, info: Value) -> Value:
    """NaN results where LAPACK reported failure (info != 0), never silent garbage."""
    b = L.b
    ok = b.compare(info, L.zeros(info.shape, info.dtype), "EQ")
    ok = b.broadcast_in_dim(ok, x.shape, list(range(info.rank)))
    return b.select(ok, x, L.full(float("nan"), x.shape, x.dtype))


def _diagonal(L: NodeLowering, x: Value) -> Value:
    return L.lower(aten.diagonal.default, x, 0, -2, -1)


def triangular_solve(
    L: NodeLowering, a: Value, rhs: Value, left: bool, lower: bool, unit: bool, transpose: str = "NO_TRANSPOSE"
) -> Value:
    attrs = (
        f"left_side = {str(left).lower()}, lower = {str(lower).lower()}, unit_diagonal = {str(unit).lower()}, "
        f"transpose_a = #stablehlo<transpose {transpose}>"
    )
    return L.b.op1("stablehlo.triangular_solve", [a, rhs], rhs.shape, rhs.dtype, attrs)


def _sum_last(L: NodeLowering, x: Value, combine: str) -> Value:
    init = L.b.constant(1 if combine == "multiply" else 0, x.dtype)
    (r,) = L.b.reduce([x], [init], [x.rank - 1], lambda acc, v: [L.b.binary(combine, acc, v)])
    return r


# -- pivots and permutations --------------------------------------------------------------
def permutation(L: NodeLowering, piv: Value, m: int) -> Value:
    """int32 ``perm`` (..., m) with ``(P^T A)[i] = A[perm[i]]`` from LAPACK's 1-based row
    swaps (applied in order: row i <-> row piv[i]-1)."""
    b = L.b
    batch = piv.shape[:-1]
    shape = batch + (m,)
    iota = b.iota(shape, len(batch), torch.int32)
    perm = iota
    for i in range(piv.shape[-1]):
        j = b.binary("subtract", b.reshape(b.slice(piv, [0] * len(batch) + [i], batch + (i + 1,)), batch), L.full(1, batch, torch.int32))
        jb = b.broadcast_in_dim(j, shape, list(range(len(batch))))
        at_j = b.compare(iota, jb, "EQ")
        at_i = b.compare(iota, L.full(i, shape, torch.int32), "EQ")
        p_i = b.broadcast_in_dim(b.reshape(b.slice(perm, [0] * len(batch) + [i], batch + (i + 1,)), batch), shape, list(range(len(batch))))
        p_j = b.broadcast_in_dim(_sum_last(L, b.select(at_j, perm, L.zeros(shape, torch.int32)), "add"), shape, list(range(len(batch))))
        perm = b.select(at_i, p_j, b.select(at_j, p_i, perm))
    return perm


def _permutation_matrix(L: NodeLowering, perm: Value, dtype: torch.dtype) -> Value:
    """P with A = P (P^T A): P[r, c] = (perm[c] == r)."""
    b = L.b
    m = perm.shape[-1]
    shape = perm.shape + (m,)
    rows = b.iota(shape, perm.rank - 1, torch.int32)
    cols = b.broadcast_in_dim(perm, shape, [*range(perm.rank - 1), perm.rank])
    return L.to(b.compare(cols, rows, "EQ"), dtype)


def _inverse_permutation(L: NodeLowering, perm: Value) -> Value:
    b = L.b
    m = perm.shape[-1]
    shape = perm.shape + (m,)  # [..., r, i]: perm[i] == r
    r = b.iota(shape, perm.rank - 1, torch.int32)
    i = b.iota(shape, perm.rank, torch.int32)
    p = b.broadcast_in_dim(perm, shape, [*range(perm.rank - 1), perm.rank])
    hit = b.select(b.compare(p, r, "EQ"), i, L.zeros(shape, torch.int32))
    return _sum_last(L, hit, "add")


def _gather_rows(L: NodeLowering, x: Value, perm: Value) -> Value:
    """out[..., i, :] = x[..., perm[i], :]."""
    idx = L.b.broadcast_in_dim(L.to(perm, torch.int64), x.shape, list(range(x.rank - 1)))
    return L.lower(aten.gather.default, x, x.rank - 2, idx)


def lu_solve(L: NodeLowering, lu: Value, piv: Value, rhs: Value, left: bool = True, adjoint: bool = False) -> Value:
    """Solve with a packed LU factorization (A = P L U); ``rhs`` batch dims already match."""
    if not left:  # X A = B  <=>  A^H X^H = B^H
        return _mH(L, lu_solve(L, lu, piv, _mH(L, rhs), True, not adjoint))
    perm = permutation(L, piv, lu.shape[-2])
    if not adjoint:
        y = _gather_rows(L, rhs, perm)
        y = triangular_solve(L, lu, y, True, True, True)
        return triangular_solve(L, lu, y, True, False, False)
    y = triangular_solve(L, lu, rhs, True, False, False, "ADJOINT")
    y = triangular_solve(L, lu, y, True, True, True, "ADJOINT")
    return _gather_rows(L, y, _inverse_permutation(L, perm))


def _perm_sign(L: NodeLowering, piv: Value, dtype: torch.dtype) -> Value:
    """(-1) ** (number of real row swaps)."""
    b = L.b
    want = b.binary("add", b.iota(piv.shape, piv.rank - 1, torch.int32), L.full(1, piv.shape, torch.int32))
    swaps = _sum_last(L, L.to(b.compare(piv, want, "NE"), torch.int32), "add")
    odd = b.binary("remainder", swaps, L.full(2, swaps.shape, torch.int32))
    return b.binary("subtract", L.full(1, odd.shape, dtype), L.to(b.binary("multiply", odd, L.full(2, odd.shape, torch.int32)), dtype))


# -- rules ------------------------------------------------------------------------------
@register(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(L: NodeLowering, a: Value, upper: bool = False, check_errors: bool = False) -> tuple[Value, Value]:
    b = L.b
    r = b.op1("stablehlo.cholesky", [a], a.shape, a.dtype, f"lower = {str(not upper).lower()}")
    r = _tri(L, r, 0, not upper)
    # info: 1 + the first diagonal entry that is not a finite positive number (0: success)
    d = _diagonal(L, r)
    d = b.op1("stablehlo.real", [d], d.shape, part_dtype(d.dtype)) if is_complex(d.dtype) else d
    n = a.shape[-1]
    bad = b.binary("or", b.compare(d, d, "NE"), b.compare(d, L.zeros(d.shape, d.dtype), "LE"))
    pos = b.binary("add", b.iota(d.shape, d.rank - 1, torch.int32), L.full(1, d.shape, torch.int32))
    first = b.select(bad, pos, L.full(n + 1, d.shape, torch.int32))
    (m,) = b.reduce([first], [b.constant(n + 1, torch.int32)], [d.rank - 1], lambda x, y: [b.binary("minimum", x, y)])
    info = b.select(b.compare(m, L.full(n + 1, m.shape, torch.int32), "EQ"), L.zeros(m.shape, torch.int32), m)
    return r, info


@register(aten.cholesky.default)
def cholesky(L: NodeLowering, a: Value, upper: bool = False) -> Value:
    return linalg_cholesky_ex(L, a, upper)[0]


@register(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(L: NodeLowering, a: Value, rhs: Value, *, upper: bool, left: bool = True, unitriangular: bool = False) -> Value:
    out = L.out[0]
    batch = out.shape[:-2]
    a = _bcast_batch(L, L.to(a, out.dtype), batch, 2)
    rhs = L.broadcast_to(L.to(rhs, out.dtype), out.shape)
    return triangular_solve(L, a, rhs, left, not upper, unitriangular)


@register(aten.triangular_solve.default)
def triangular_solve_(L: NodeLowering, rhs: Value, a: Value, upper: bool = True, transpose: bool = False, unitriangular: bool = False) -> tuple[Value, Value]:
    out, a_out = L.out[0], L.out[1]
    a = L.broadcast_to(a, a_out.shape)
    rhs = L.broadcast_to(rhs, out.shape)
    x = triangular_solve(L, a, rhs, True, not upper, unitriangular, "TRANSPOSE" if transpose else "NO_TRANSPOSE")
    return x, a


@register(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(L: NodeLowering, a: Value, *, pivot: bool = True, check_errors: bool = False) -> tuple[Value, Value, Value]:
    if not pivot:
        raise NotImplementedError("torchtpu: LU without pivoting is not implemented (nor is it on PyTorch's CPU); use pivot=True")
    return getrf(L, a)


def _unpack(L: NodeLowering, lu: Value, piv: Value) -> tuple[Value, Value, Value]:
    b = L.b
    batch, (m, n) = lu.shape[:-2], lu.shape[-2:]
    k = min(m, n)
    nb = len(batch)
    low = b.slice(lu, [0] * lu.rank, batch + (m, k))
    eye = L.to(b.compare(b.iota(batch + (m, k), nb, torch.int32), b.iota(batch + (m, k), nb + 1, torch.int32), "EQ"), lu.dtype)
    lower = b.binary("add", _tri(L, low, -1, True), eye)
    upper = _tri(L, b.slice(lu, [0] * lu.rank, batch + (k, n)), 0, False)
    p = _permutation_matrix(L, permutation(L, piv, m), lu.dtype)
    return p, lower, upper


@register(aten.linalg_lu.default)
def linalg_lu(L: NodeLowering, a: Value, *, pivot: bool = True) -> tuple[Value, Value, Value]:
    lu, piv, _ = linalg_lu_factor_ex(L, a, pivot=pivot)
    return _unpack(L, lu, piv)


@register(aten.lu_unpack.default)
def lu_unpack(L: NodeLowering, lu: Value, piv: Value, unpack_data: bool = True, unpack_pivots: bool = True) -> tuple[Value, Value, Value]:
    p, lower, upper = _unpack(L, lu, piv)
    outs = []
    for v, spec in zip((p, lower, upper), L.out):
        outs.append(v if v.shape == spec.shape else L.zeros(spec.shape, spec.dtype))
    return tuple(outs)


@register(aten.linalg_lu_solve.default)
def linalg_lu_solve(L: NodeLowering, lu: Value, piv: Value, rhs: Value, *, left: bool = True, adjoint: bool = False) -> Value:
    out = L.out[0]
    batch = out.shape[:-2]
    lu = _bcast_batch(L, lu, batch, 2)
    piv = _bcast_batch(L, piv, batch, 1)
    return lu_solve(L, lu, piv, L.broadcast_to(rhs, out.shape), left, adjoint)


def _is_vector_rhs(a: Value, rhs: Value) -> bool:
    return rhs.rank == 1 or (rhs.rank == a.rank - 1 and rhs.shape == a.shape[:-1])


@register(aten._linalg_solve_ex.default)
def linalg_solve_ex(L: NodeLowering, a: Value, rhs: Value, *, left: bool = True, check_errors: bool = False) -> tuple[Value, Value, Value, Value]:
    """LU is the factorization of A itself, as PyTorch 2.13's CPU kernel returns it
    (its backward solves the adjoint system with that LU)."""
    return _solve_ex(L, a, rhs, left, use_a_t=False)


def _solve_ex(L: NodeLowering, a: Value, rhs: Value, left: bool, use_a_t: bool) -> tuple[Value, Value, Value, Value]:
    out, lu_spec = L.out[0], L.out[1]
    a = L.broadcast_to(a, lu_spec.shape)
    lu, piv, info = getrf(L, _mT(L, a) if use_a_t else a)
    vector = _is_vector_rhs(a, rhs)
    if vector:
        rhs = L.b.reshape(rhs, rhs.shape + (1,))
    # the LU keeps A's batch shape; the solve runs over A's and B's broadcast batch
    batch = tuple(torch.broadcast_shapes(lu.shape[:-2], rhs.shape[:-2]))
    x = lu_solve(L, _bcast_batch(L, lu, batch, 2), _bcast_batch(L, piv, batch, 1), _bcast_batch(L, rhs, batch, 2), left, use_a_t)
    return L.b.reshape(x, out.shape), lu, piv, info


@register(aten.linalg_inv_ex.default)
def linalg_inv_ex(L: NodeLowering, a: Value, *, check_errors: bool = False) -> tuple[Value, Value]:
    lu, piv, info = getrf(L, a)
    batch, n = a.shape[:-2], a.shape[-1]
    nb = len(batch)
    shape = batch + (n, n)
    eye = L.to(L.b.compare(L.b.iota(shape, nb, torch.int32), L.b.iota(shape, nb + 1, torch.int32), "EQ"), a.dtype)
    return lu_solve(L, lu, piv, eye), info


def lu_layout_kernel(name: str, A: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: N803 - schema name
    """Eager tpu kernel of ``_linalg_det``/``_linalg_slogdet``. PyTorch's CPU kernels factor
    A^T when A is contiguous and real (A otherwise), and the backward formulas re-derive
    that choice from A's strides to reuse the LU. The rules below factor A^T for a real A
    (the layout a compiled graph's contiguous inputs have); for a strided real A this
    kernel hands them A^T instead: same determinant, and the LU of A itself."""
    from ...eager.dispatch import run

    if not A.is_contiguous() and not A.is_complex():
        A = A.mT
    return run(getattr(aten, name).default, (A,), {})


def _det_lu(L: NodeLowering, a: Value) -> tuple[Value, Value]:
    lu, piv, _ = getrf(L, a if is_complex(a.dtype) else _mT(L, a))
    return lu, piv


@register(aten._linalg_det.default)
def linalg_det(L: NodeLowering, a: Value) -> tuple[Value, Value, Value]:
    lu, piv = _det_lu(L, a)
    det = L.b.binary("multiply", _perm_sign(L, piv, a.dtype), _sum_last(L, _diagonal(L, lu), "multiply"))
    return det, lu, piv


@register(aten._linalg_slogdet.default)
def linalg_slogdet(L: NodeLowering, a: Value) -> tuple[Value, Value, Value, Value]:
    b = L.b
    lu, piv = _det_lu(L, a)
    d = _diagonal(L, lu)
    absd = b.unary("abs", d, part_dtype(d.dtype) if is_complex(d.dtype) else d.dtype)
    logabs = _sum_last(L, b.unary("log", absd), "add")
    if is_complex(d.dtype):
        zero = b.compare(absd, L.zeros(absd.shape, absd.dtype), "EQ")
        unit = b.binary("divide", d, L.to(absd, d.dtype))
        unit = b.select(zero, L.zeros(d.shape, d.dtype), unit)
    else:
        unit = b.unary("sign", d)
    sign = b.binary("multiply", _perm_sign(L, piv, d.dtype), _sum_last(L, unit, "multiply"))
    return sign, logabs, lu, piv


@register(aten.linalg_qr.default)
def linalg_qr(L: NodeLowering, a: Value, mode: str = "reduced") -> tuple[Value, Value]:
    b = L.b
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    k = min(m, n)
    qr, tau = geqrf(L, a)
    rows = m if mode == "complete" else k
    r = _tri(L, b.slice(qr, [0] * a.rank, batch + (rows, n)), 0, False)
    if mode == "r":
        return L.zeros(L.out[0].shape, a.dtype), r
    cols = m if mode == "complete" or m < n else n
    if cols <= n:
        basis = b.slice(qr, [0] * a.rank, batch + (m, cols))
    else:  # complete Q of a tall matrix: LAPACK extends the reflectors to m columns
        basis = b.pad(qr, b.constant(0, a.dtype), [0] * a.rank, [0] * (a.rank - 1) + [cols - n])
    return orgqr(L, basis, tau), r


@register(aten.linalg_householder_product.default)
def householder_product(L: NodeLowering, a: Value, tau: Value) -> Value:
    return orgqr(L, a, tau)


@register(aten._linalg_svd.default)
def linalg_svd(L: NodeLowering, a: Value, full_matrices: bool = False, compute_uv: bool = True, *, driver: str | None = None) -> tuple[Value, Value, Value]:
    s, u, vt, info = gesdd(L, a, full_matrices, compute_uv)
    s = _nan_where_failed(L, s, info)
    if not compute_uv:
        return L.zeros(L.out[0].shape, a.dtype), s, L.zeros(L.out[2].shape, a.dtype)
    return _nan_where_failed(L, u, info), s, _nan_where_failed(L, vt, info)


@register(aten._linalg_eigh.default)
def linalg_eigh(L: NodeLowering, a: Value, UPLO: str = "L", compute_v: bool = True) -> tuple[Value, Value]:  # noqa: N803 - schema name
    w, v, info = syevd(L, a, UPLO.upper() == "L", compute_v)
    w = _nan_where_failed(L, w, info)
    if not compute_v:
        return w, L.zeros(L.out[1].shape, a.dtype)
    return w, _nan_where_failed(L, v, info)
