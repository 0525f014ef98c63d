"""Linear algebra: native StableHLO where it exists (cholesky, triangular_solve, and what is
built from them: cholesky_solve/cholesky_inverse; matrix_exp from matmuls), LAPACK through
XLA's CPU custom calls for the rest (getrf: LU/solve/inv/det; geqrf+orgqr/ormqr: QR,
householder products, lstsq's gels; gesdd: SVD, lstsq's gelsd/gelss; syevd/heevd: eigh;
geev: eig). LDL (sytrf) has no rule: the XLA CPU runtime registers no sytrf target.

The LAPACK calls are XLA's typed-FFI LAPACK handlers (``lapack_sgetrf_ffi`` ...), registered
with the CPU client by ``runtime/pjrt.py``. They read column-major matrices, which the
``operand_layouts``/``result_layouts`` attributes ask XLA to provide; leading dims are a
batch. Only XLA's CPU client has them (the program context's ``has_lapack``): on tpu/cuda
these ops raise NotImplementedError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...stablehlo.builder import Value
from ...stablehlo.types import is_complex
from ..context import NodeLowering
from ..registry import register
from .complex import conj, make_complex, part_dtype
from .view import _tri

aten = torch.ops.aten

_COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_PREFIX = {torch.float32: "s", torch.float64: "d", torch.complex64: "c", torch.complex128: "z"}
_ORGQR = {"s": "sorgqr", "d": "dorgqr", "c": "cungqr", "z": "zungqr"}
_SYEVD = {"s": "ssyevd", "d": "dsyevd", "c": "cheevd", "z": "zheevd"}
_ORMQR = {"s": "sormqr", "d": "dormqr", "c": "cunmqr", "z": "zunmqr"}


# -- custom-call plumbing --------------------------------------------------------------
def _lapack(L: NodeLowering, routine: str, dtype: torch.dtype) -> str:
    """The FFI target for ``routine`` (e.g. "getrf") in ``dtype``; raises where unavailable."""
    what = L.op.name() if L.op is not None else routine
    if not L.ctx.has_lapack:
        raise NotImplementedError(
            f"torchtpu: '{what}' needs LAPACK, which XLA provides only on the cpu platform "
            f"(this process runs on {L.ctx.platform}); compute it on the CPU with .cpu() and move the result back"
        )
    if dtype not in _PREFIX:
        raise NotImplementedError(
            f"torchtpu: '{what}' supports float32, float64, complex64 and complex128, not {dtype}; convert the input first"
        )
    p = _PREFIX[dtype]
    name = {"orgqr": _ORGQR[p], "syevd": _SYEVD[p], "ormqr": _ORMQR[p]}.get(routine, p + routine)
    return f"lapack_{name}_ffi"


def _matrix_layout(rank: int) -> list[int]:
    """Minor-to-major layout of a column-major batch of matrices."""
    return [rank - 2, rank - 1, *range(rank - 3, -1, -1)]


def _row_major(rank: int) -> list[int]:
    return list(range(rank - 1, -1, -1))


def _char(c: str) -> str:
    return f"{ord(c)} : ui8"


def _is_empty(a: Value) -> bool:
    """LAPACK rejects a leading dimension of 0 ("parameter 4 had an illegal value"): the
    helpers below answer empty inputs without calling it."""
    return 0 in a.shape


def getrf(L: NodeLowering, a: Value) -> tuple[Value, Value, Value]:
    """LU with partial pivoting: (packed LU, 1-based int32 pivots, int32 info)."""
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    k = min(m, n)
    if _is_empty(a):
        return a, L.zeros(batch + (k,), torch.int32), L.zeros(batch, torch.int32)
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
    if _is_empty(a):
        return a, L.zeros(batch + (min(m, n),), a.dtype)
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
    if _is_empty(a):
        return a
    (q,) = L.b.custom_call(
        _lapack(L, "orgqr", a.dtype),
        [a, tau],
        [(a.shape, a.dtype)],
        operand_layouts=[_matrix_layout(a.rank), _row_major(tau.rank)],
        result_layouts=[_matrix_layout(a.rank)],
        aliases={0: 0},
    )
    return q


def ormqr(L: NodeLowering, a: Value, tau: Value, c: Value, left: bool, transpose: bool) -> Value:
    """Q c, Q^H c, c Q or c Q^H for the Q of the Householder reflectors (a, tau); batch
    dims already match."""
    if _is_empty(c) or tau.shape[-1] == 0:
        return c
    (out,) = L.b.custom_call(
        _lapack(L, "ormqr", a.dtype),
        [a, tau, c],
        [(c.shape, c.dtype)],
        config={"left": str(left).lower(), "transpose": str(transpose).lower()},
        operand_layouts=[_matrix_layout(a.rank), _row_major(tau.rank), _matrix_layout(c.rank)],
        result_layouts=[_matrix_layout(c.rank)],
        aliases={0: 2},
    )
    return out


def geev(L: NodeLowering, a: Value, vectors: bool) -> tuple[Value, Value, Value]:
    """Eigenvalues (complex), right eigenvectors (complex, unit 2-norm, largest entry
    real, as LAPACK normalizes them) and info of a general square matrix. The real
    routines return the eigenvalues as (real, imaginary) parts."""
    batch, n = a.shape[:-2], a.shape[-1]
    cdt = a.dtype if is_complex(a.dtype) else _COMPLEX_OF[a.dtype]
    mat_lay, vec_lay, info_lay = _matrix_layout(a.rank), _row_major(len(batch) + 1), _row_major(len(batch))
    values = [(batch + (n,), cdt)] if is_complex(a.dtype) else [(batch + (n,), a.dtype)] * 2
    *w, _, vr, info = L.b.custom_call(
        _lapack(L, "geev", a.dtype),
        [a],
        [*values, (a.shape, cdt), (a.shape, cdt), (batch, torch.int32)],  # w, left and right vectors, info
        config={"compute_left": _char("N"), "compute_right": _char("V" if vectors else "N")},
        operand_layouts=[mat_lay],
        result_layouts=[vec_lay] * len(values) + [mat_lay, mat_lay, info_lay],
    )
    return (w[0] if len(w) == 1 else make_complex(L, *w)), vr, info


def gesdd(L: NodeLowering, a: Value, full: bool, compute_uv: bool) -> tuple[Value, Value, Value, Value]:
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    k = min(m, n)
    mode = "A" if full and compute_uv else ("S" if compute_uv else "N")
    u_shape = batch + ((m, m) if mode == "A" else (m, k))
    vt_shape = batch + ((n, n) if mode == "A" else (k, n))
    if k == 0:  # LAPACK rejects an empty matrix; the CPU returns identities for the full factors
        real = part_dtype(a.dtype) if is_complex(a.dtype) else a.dtype
        return L.zeros(batch + (0,), real), _eye(L, u_shape, a.dtype), _eye(L, vt_shape, a.dtype), L.zeros(batch, torch.int32)
    lay = _matrix_layout(a.rank)
    _, s, u, vt, info = L.b.custom_call(
        _lapack(L, "gesdd", a.dtype),
        [a],
        [
            (a.shape, a.dtype),
            (batch + (k,), part_dtype(a.dtype) if is_complex(a.dtype) else a.dtype),
            (u_shape, a.dtype),
            (vt_shape, a.dtype),
            (batch, torch.int32),
        ],
        config={"mode": _char(mode)},
        operand_layouts=[lay],
        result_layouts=[lay, _row_major(len(batch) + 1), lay, lay, _row_major(len(batch))],
        aliases={0: 0},
    )
    return s, u, vt, info


def _eye(L: NodeLowering, shape: tuple[int, ...], dtype: torch.dtype) -> Value:
    """Identity matrices of ``shape`` (batch + (r, c)); empty shapes stay empty."""
    rows = L.b.iota(shape, len(shape) - 2, torch.int64)
    cols = L.b.iota(shape, len(shape) - 1, torch.int64)
    return L.to(L.b.compare(rows, cols, "EQ"), dtype)


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
        j = b.binary(
            "subtract", b.reshape(b.slice(piv, [0] * len(batch) + [i], batch + (i + 1,)), batch), L.full(1, batch, torch.int32)
        )
        jb = b.broadcast_in_dim(j, shape, list(range(len(batch))))
        at_j = b.compare(iota, jb, "EQ")
        at_i = b.compare(iota, L.full(i, shape, torch.int32), "EQ")
        p_i = b.broadcast_in_dim(
            b.reshape(b.slice(perm, [0] * len(batch) + [i], batch + (i + 1,)), batch), shape, list(range(len(batch)))
        )
        p_j = b.broadcast_in_dim(
            _sum_last(L, b.select(at_j, perm, L.zeros(shape, torch.int32)), "add"), shape, list(range(len(batch)))
        )
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
    return b.binary(
        "subtract", L.full(1, odd.shape, dtype), L.to(b.binary("multiply", odd, L.full(2, odd.shape, torch.int32)), dtype)
    )


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
    info = _cholesky_info(L, a, upper, info)
    if check_errors:
        _check_info(L, info, "linalg.cholesky_ex", "cholesky")
    return r, info


def _cholesky_info(L: NodeLowering, a: Value, upper: bool, failed_at: Value) -> Value:
    """LAPACK's info where XLA's factorization failed (``failed_at`` != 0): the order of the
    first leading minor that is not positive-definite. XLA fills a failed matrix with NaN,
    which says only that it failed; an unblocked factorization of the triangle potrf reads
    finds the order, in a while loop that runs no step unless some matrix failed."""
    if 0 in a.shape:
        return failed_at
    b = L.b
    i32 = torch.int32
    if upper:  # the lower triangle of A^H is A's upper one
        a = _mH(L, a)
    failed = b.compare(failed_at, L.zeros(failed_at.shape, i32), "NE")

    def unknown(k: Value, m: Value, info: Value, failed: Value) -> Value:
        pending = b.binary("and", failed, b.compare(info, L.zeros(info.shape, i32), "EQ"))
        return b.binary("and", b.compare(k, b.constant(a.shape[-1], i32), "LT"), L.any_true(pending))

    init = [b.constant(0, i32), a, L.zeros(failed.shape, i32), failed]
    _, _, info, _ = b.while_loop(init, unknown, lambda k, m, info, failed: [*_cholesky_step(L, k, m, info), failed])
    return b.select(failed, b.select(b.compare(info, L.zeros(info.shape, i32), "NE"), info, failed_at), failed_at)


def _cholesky_step(L: NodeLowering, k: Value, m: Value, info: Value) -> list[Value]:
    """Column ``k`` of a right-looking Cholesky (the lower triangle of ``m``): record
    ``k + 1`` where the pivot is not positive (or NaN), then update the trailing block."""
    b = L.b
    i32 = torch.int32
    batch, n = m.shape[:-2], m.shape[-1]
    nb = len(batch)
    z = b.constant(0, i32)
    p = b.reshape(b.dynamic_slice(m, [z] * nb + [k, k], batch + (1, 1)), batch)
    p = b.op1("stablehlo.real", [p], p.shape, part_dtype(p.dtype)) if is_complex(p.dtype) else p
    bad = b.unary("not", b.compare(p, L.zeros(p.shape, p.dtype), "GT"))
    k1 = b.broadcast_in_dim(b.binary("add", k, b.constant(1, i32)), info.shape, [])
    info = b.select(b.binary("and", bad, b.compare(info, L.zeros(info.shape, i32), "EQ")), k1, info)
    col_shape = batch + (n, 1)
    col = b.dynamic_slice(m, [z] * nb + [z, k], col_shape)
    scale = b.unary("rsqrt", b.select(bad, L.full(1, p.shape, p.dtype), p))
    scale = b.broadcast_in_dim(L.to(scale, m.dtype), col_shape, list(range(nb)))
    below = b.compare(b.iota(col_shape, nb, i32), b.broadcast_in_dim(k, col_shape, []), "GT")
    keep = b.binary("and", below, b.unary("not", b.broadcast_in_dim(bad, col_shape, list(range(nb)))))
    lcol = b.reshape(b.select(keep, b.binary("multiply", col, scale), L.zeros(col_shape, m.dtype)), batch + (n,))
    full = batch + (n, n)
    outer = b.binary(
        "multiply",
        b.broadcast_in_dim(lcol, full, [*range(nb), nb]),
        b.broadcast_in_dim(conj(L, lcol), full, [*range(nb), nb + 1]),
    )
    return [b.binary("add", k, b.constant(1, i32)), b.binary("subtract", m, outer), info]


# _linalg_check_errors's texts for info > 0, by the kind of API (``{i}``: the info)
_LINALG_ERRORS = {
    "cholesky": (
        torch.linalg.LinAlgError,
        "The factorization could not be completed because the input is not positive-definite "
        "(the leading minor of order {i} is not positive-definite).",
    ),
    "inv": (
        torch.linalg.LinAlgError,
        "The diagonal element {i} is zero, the inversion could not be completed because the input matrix is singular.",
    ),
    "solve": (torch.linalg.LinAlgError, "The solver failed because the input matrix is singular."),
    "lu_factor": (
        RuntimeError,
        "U[{i},{i}] is zero and using it on lu_solve would result in a division by zero. If you still want to "
        "perform the factorization, consider calling linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)",
    ),
}


def _check_info(L: NodeLowering, info: Value, api: str, kind: str) -> None:
    """The error the CPU raises for a nonzero LAPACK ``info`` (check_errors=True), naming
    the first failing matrix of a batch as it does."""
    exc, text = _LINALG_ERRORS[kind]
    bad = L.b.compare(info, L.zeros(info.shape, info.dtype), "NE")
    if not info.shape:
        L.check(bad, f"{api}: " + text.replace("{i}", "{0}"), exc=exc, values=[info])
        return
    index = L.b.reshape(L.b.iota((math.prod(info.shape),), 0, torch.int64), info.shape)
    L.check(bad, f"{api}: (Batch element {{0}}): " + text.replace("{i}", "{1}"), exc=exc, values=[index, info])


@register(aten.cholesky.default)
def cholesky(L: NodeLowering, a: Value, upper: bool = False) -> Value:
    r, info = linalg_cholesky_ex(L, a, upper)
    _check_info(L, info, "cholesky", "cholesky")
    return r


@register(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(
    L: NodeLowering, a: Value, rhs: Value, *, upper: bool, left: bool = True, unitriangular: bool = False
) -> Value:
    out = L.out[0]
    batch = out.shape[:-2]
    a = _bcast_batch(L, L.to(a, out.dtype), batch, 2)
    rhs = L.broadcast_to(L.to(rhs, out.dtype), out.shape)
    return triangular_solve(L, a, rhs, left, not upper, unitriangular)


@register(aten.triangular_solve.default)
def triangular_solve_(
    L: NodeLowering, rhs: Value, a: Value, upper: bool = True, transpose: bool = False, unitriangular: bool = False
) -> tuple[Value, Value]:
    out, a_out = L.out[0], L.out[1]
    a = L.broadcast_to(a, a_out.shape)
    rhs = L.broadcast_to(rhs, out.shape)
    x = triangular_solve(L, a, rhs, True, not upper, unitriangular, "TRANSPOSE" if transpose else "NO_TRANSPOSE")
    return x, a


@register(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(
    L: NodeLowering, a: Value, *, pivot: bool = True, check_errors: bool = False
) -> tuple[Value, Value, Value]:
    if not pivot:
        raise NotImplementedError("torchtpu: LU without pivoting is not implemented (nor is it on PyTorch's CPU); use pivot=True")
    lu, piv, info = getrf(L, a)
    if check_errors:
        _check_info(L, info, "torch.linalg.lu_factor_ex", "lu_factor")
    return lu, piv, info


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
def lu_unpack(
    L: NodeLowering, lu: Value, piv: Value, unpack_data: bool = True, unpack_pivots: bool = True
) -> tuple[Value, Value, Value]:
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
def linalg_solve_ex(
    L: NodeLowering, a: Value, rhs: Value, *, left: bool = True, check_errors: bool = False
) -> tuple[Value, Value, Value, Value]:
    """LU is the factorization of A itself, as PyTorch 2.13's CPU kernel returns it
    (its backward solves the adjoint system with that LU)."""
    x, lu, piv, info = _solve_ex(L, a, rhs, left, use_a_t=False)
    if check_errors:
        _check_info(L, info, "torch.linalg.solve_ex", "solve")
    return x, lu, piv, info


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
    if check_errors:
        _check_info(L, info, "linalg.inv_ex", "inv")
    return lu_solve(L, lu, piv, eye), info


def _det_lu(L: NodeLowering, a: Value) -> tuple[Value, Value]:
    """The LU PyTorch's CPU kernel returns for a contiguous A: of A^T when real, of A when
    complex (the eager kernel in eager/register.py hands a strided real A in transposed)."""
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
def linalg_svd(
    L: NodeLowering, a: Value, full_matrices: bool = False, compute_uv: bool = True, *, driver: str | None = None
) -> tuple[Value, Value, Value]:
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


# -- Cholesky-based solves ----------------------------------------------------------------
def _eye(L: NodeLowering, shape: Sequence[int], dtype: torch.dtype) -> Value:
    nb = len(shape) - 2
    rows, cols = L.b.iota(shape, nb, torch.int32), L.b.iota(shape, nb + 1, torch.int32)
    return L.to(L.b.compare(rows, cols, "EQ"), dtype)


def cholesky_solve(L: NodeLowering, factor: Value, rhs: Value, upper: bool) -> Value:
    """X with A X = B for A = L L^H (``upper``: A = U^H U), as two triangular solves."""
    if upper:
        y = triangular_solve(L, factor, rhs, True, False, False, "ADJOINT")
        return triangular_solve(L, factor, y, True, False, False)
    y = triangular_solve(L, factor, rhs, True, True, False)
    return triangular_solve(L, factor, y, True, True, False, "ADJOINT")


@register(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(L: NodeLowering, rhs: Value, factor: Value, upper: bool) -> Value:
    # cholesky_solve (CompositeExplicitAutograd) has already broadcast the batch dims
    return cholesky_solve(L, factor, rhs, upper)


@register(aten.cholesky_inverse.default)
def cholesky_inverse(L: NodeLowering, factor: Value, upper: bool = False) -> Value:
    return cholesky_solve(L, factor, _eye(L, factor.shape, factor.dtype), upper)


# -- matrix exponential ---------------------------------------------------------------------
# PyTorch's CPU kernel (mexp in LinearAlgebra.cpp; Bader, Blanes & Casas 2019): optimized
# Taylor polynomials of degree 1, 2, 4, 8, 12 or 18 picked per matrix by its 1-norm, and
# scaling and squaring above the degree-18 bound. Here every degree is computed for every
# matrix and the right one selected (no host round trip); the squarings run in a while
# loop that stops at the largest count any matrix of the batch needs.
_MEXP_THETAS = {
    "float": (
        1.192092800768788e-07,
        5.978858893805233e-04,
        5.116619363445086e-02,
        5.800524627688768e-01,
        1.461661507209034e00,
        3.010066362817634e00,
    ),
    "double": (
        2.220446049250313e-16,
        2.580956802971767e-08,
        3.397168839976962e-04,
        4.991228871115323e-02,
        2.996158913811580e-01,
        1.090863719290036e00,
    ),
}
_T12 = (
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989),
    (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359),
)
_T18 = (
    (0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.0),
    (0.0, 3.97849749499645077844e-01, 1.36783778460411720168e00, 4.98289622525382669416e-01, -6.37898194594723280150e-04),
    (
        -1.09676396052962061844e01,
        1.68015813878906206114e00,
        5.71779846478865511061e-02,
        -6.98210122488052056106e-03,
        3.34975017086070470649e-05,
    ),
    (
        -9.04316832390810593223e-02,
        -6.76404519071381882256e-02,
        6.75961301770459654925e-02,
        2.95552570429315521194e-02,
        -1.39180257516060693404e-05,
    ),
    (0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05),
)


def matmul(L: NodeLowering, x: Value, y: Value) -> Value:
    """Batched x @ y (same batch dims) at full precision: the factorizations' accuracy
    must not depend on the program's matmul precision setting."""
    nb = x.rank - 2
    batch = list(range(nb))
    return L.b.dot_general(x, y, [nb + 1], [nb], batch, batch, precision="HIGHEST")


def _combine(L: NodeLowering, coeffs: Sequence[float], mats: Sequence[Value]) -> Value:
    """sum_j coeffs[j] * mats[j] (zero coefficients skipped)."""
    acc = None
    for c, m in zip(coeffs, mats):
        if c == 0:
            continue
        term = m if c == 1 else L.b.binary("multiply", m, L.full(c, m.shape, m.dtype))
        acc = term if acc is None else L.b.binary("add", acc, term)
    return acc if acc is not None else L.zeros(mats[0].shape, mats[0].dtype)


def _taylor(L: NodeLowering, a: Value, degree: int) -> Value:
    """The kernel's degree-``degree`` polynomial approximation of exp(a)."""
    eye = _eye(L, a.shape, a.dtype)
    if degree == 1:
        return _combine(L, (1, 1), (eye, a))
    a2 = matmul(L, a, a)
    if degree == 2:
        return _combine(L, (1, 1, 0.5), (eye, a, a2))
    if degree == 4:
        tail = matmul(L, a2, _combine(L, (1 / 2, 1 / 6, 1 / 24), (eye, a, a2)))
        return _combine(L, (1, 1, 1), (eye, a, tail))
    if degree == 8:
        sqrt_177 = 0.1330413469565007072504e2
        x3 = 2.0 / 3.0
        x1, x2 = x3 * ((1 + sqrt_177) / 88), x3 * ((1 + sqrt_177) / 352)
        x4, x5 = (-271 + 29 * sqrt_177) / (315 * x3), (-11 + 11 * sqrt_177) / (1260 * x3)
        x6, x7 = (-99 + 11 * sqrt_177) / (5040 * x3), (89 - sqrt_177) / (5040 * x3)
        y2 = (857 - 58 * sqrt_177) / 630
        a4 = matmul(L, a2, _combine(L, (x1, x2), (a, a2)))
        a8 = matmul(L, _combine(L, (x3, 1), (a2, a4)), _combine(L, (x4, x5, x6, x7), (eye, a, a2, a4)))
        return _combine(L, (1, 1, y2, 1), (eye, a, a2, a8))
    a3 = matmul(L, a, a2)
    if degree == 12:
        bs = [_combine(L, row, (eye, a, a2, a3)) for row in _T12]
        bs[2] = L.b.binary("add", bs[2], matmul(L, bs[3], bs[3]))
        return L.b.binary("add", bs[0], matmul(L, L.b.binary("add", bs[1], bs[2]), bs[2]))
    a6 = matmul(L, a3, a3)
    bs = [_combine(L, row, (eye, a, a2, a3, a6)) for row in _T18]
    bs[3] = L.b.binary("add", bs[3], matmul(L, bs[0], bs[4]))
    return L.b.binary("add", bs[1], matmul(L, L.b.binary("add", bs[2], bs[3]), bs[3]))


def _one_norm(L: NodeLowering, a: Value) -> Value:
    """max_j sum_i |a_ij| per matrix (real)."""
    b = L.b
    absa = b.unary("abs", a, part_dtype(a.dtype) if is_complex(a.dtype) else a.dtype)
    (cols,) = b.reduce([absa], [b.constant(0, absa.dtype)], [a.rank - 2], lambda x, y: [b.binary("add", x, y)])
    (norm,) = b.reduce([cols], [b.constant(float("-inf"), absa.dtype)], [cols.rank - 1], lambda x, y: [b.binary("maximum", x, y)])
    return norm


def _per_matrix(L: NodeLowering, mask: Value, shape: Sequence[int]) -> Value:
    return L.b.broadcast_in_dim(mask, tuple(shape), list(range(mask.rank)))


@register(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(L: NodeLowering, a: Value) -> Value:
    if _is_empty(a):
        return a
    if a.shape[-1] == 1:
        return L.b.unary("exponential", a)
    if a.dtype in (torch.float16, torch.bfloat16):  # computed in float32, rounded once
        return L.to(_matrix_exp(L, L.to(a, torch.float32)), a.dtype)
    return _matrix_exp(L, a)


def _matrix_exp(L: NodeLowering, a: Value) -> Value:
    b = L.b
    real = part_dtype(a.dtype) if is_complex(a.dtype) else a.dtype
    thetas = _MEXP_THETAS["double" if real == torch.float64 else "float"]
    norm = _one_norm(L, a)

    # degree 18 with scaling and squaring: s squarings of T18(a / 2^s)
    log2 = b.binary(
        "divide",
        b.unary("log", b.binary("divide", norm, L.full(thetas[5], norm.shape, real))),
        L.full(math.log(2), norm.shape, real),
    )
    s = b.binary("maximum", b.unary("ceil", log2), L.zeros(norm.shape, real))
    scale = b.binary("power", L.full(2.0, s.shape, real), s)
    scaled = b.binary("divide", a, L.to(_per_matrix(L, scale, a.shape), a.dtype))
    steps = L.to(s, torch.int32)
    (most,) = b.reduce([steps], [b.constant(0, torch.int32)], list(range(steps.rank)), lambda x, y: [b.binary("maximum", x, y)])

    def more(i: Value, _most: Value, _steps: Value, _m: Value) -> Value:
        return b.compare(i, _most, "LT")

    def square(i: Value, _most: Value, _steps: Value, m: Value) -> list[Value]:
        todo = _per_matrix(L, b.compare(b.broadcast_in_dim(i, _steps.shape, []), _steps, "LT"), m.shape)
        nxt = b.binary("add", i, b.constant(1, torch.int32))
        return [nxt, _most, _steps, b.select(todo, matmul(L, m, m), m)]

    _, _, _, big = b.while_loop([b.constant(0, torch.int32), most, steps, _taylor(L, scaled, 18)], more, square)

    # the smaller degrees, each for the norms in (thetas[i-1], thetas[i]]
    out = big
    lower = -1.0
    for degree, theta in zip((1, 2, 4, 8, 12), thetas):
        inside = b.binary(
            "and",
            b.compare(norm, L.full(lower, norm.shape, real), "GT"),
            b.compare(norm, L.full(theta, norm.shape, real), "LE"),
        )
        out = b.select(_per_matrix(L, inside, a.shape), _taylor(L, a, degree), out)
        lower = theta
    return out


# -- Householder QR pieces: geqrf, ormqr ------------------------------------------------------
_meta_libs: list[torch.library.Library] = []


def _geqrf_meta(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = a.shape[-2:]
    return a.new_empty(a.shape).mT.contiguous().mT, a.new_empty((*a.shape[:-2], min(m, n)))


def _register_missing_meta_kernels() -> None:
    """PyTorch has no Meta kernel for geqrf or linalg_lstsq: without one no output
    shape can be inferred for them (the rules need it)."""
    lib = torch.library.Library("aten", "IMPL")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::geqrf", "Meta"):
        lib.impl("geqrf", _geqrf_meta, "Meta")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::linalg_lstsq", "Meta"):
        lib.impl("linalg_lstsq", _lstsq_meta, "Meta")
    _meta_libs.append(lib)


@register(aten.geqrf.default)
def geqrf_(L: NodeLowering, a: Value) -> tuple[Value, Value]:
    return geqrf(L, a)


@register(aten.ormqr.default)
def ormqr_(L: NodeLowering, a: Value, tau: Value, c: Value, left: bool = True, transpose: bool = False) -> Value:
    return ormqr(L, a, tau, c, left, transpose)


# -- least squares ----------------------------------------------------------------------------
_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _lstsq_driver(driver: str | None) -> str:
    driver = driver or "gelsy"  # the CPU's default
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(f"torch.linalg.lstsq: parameter `driver` should be one of {_LSTSQ_DRIVERS}, got {driver!r}")
    return driver


def _lstsq_meta(
    a: torch.Tensor, b: torch.Tensor, rcond: float | None = None, *, driver: str | None = None
) -> tuple[torch.Tensor, ...]:
    """Output shapes of the CPU kernel: residuals only for m > n (not with gelsy), the
    rank except with gels, singular values with gelsd/gelss; else empty tensors."""
    driver = _lstsq_driver(driver)
    vector = b.dim() == a.dim() - 1
    m, n = a.shape[-2:]
    k = 1 if vector else b.shape[-1]
    batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-1] if vector else b.shape[:-2]))
    real = a.real.dtype if a.is_complex() else a.dtype
    sol = a.new_empty(batch + ((n,) if vector else (n, k)))
    res = a.new_empty(batch + (k,) if m > n and driver != "gelsy" else (0,), dtype=real)
    rank = a.new_empty(batch if driver != "gels" else (0,), dtype=torch.int64)
    sv = a.new_empty(batch + (min(m, n),) if driver in ("gelsd", "gelss") else (0,), dtype=real)
    return sol, res, rank, sv


def _lstsq_qr(L: NodeLowering, a: Value, rhs: Value) -> Value:
    """The least-squares (m >= n) or minimum-norm (m < n) solution of a full-rank A, as
    LAPACK's gels computes it: QR of A, or QR of A^H (an LQ of A)."""
    b = L.b
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    k = rhs.shape[-1]
    zeros = [0] * a.rank
    if m >= n:
        qr, tau = geqrf(L, a)
        c = ormqr(L, qr, tau, rhs, True, True)  # Q^H B
        r = b.slice(qr, zeros, batch + (n, n))
        return triangular_solve(L, r, b.slice(c, zeros, batch + (n, k)), True, False, False)
    qr, tau = geqrf(L, _mH(L, a))  # A^H = Q R: A = R^H Q^H
    r = b.slice(qr, zeros, batch + (m, m))
    y = triangular_solve(L, r, rhs, True, False, False, "ADJOINT")  # R^H y = B
    y = b.pad(y, b.constant(0, y.dtype), zeros, [0] * (a.rank - 2) + [n - m, 0])
    return ormqr(L, qr, tau, y, True, False)  # x = Q [y; 0]


def _lstsq_svd(L: NodeLowering, a: Value, rhs: Value, rcond: float | None) -> tuple[Value, Value, Value]:
    """The minimum-norm solution through the SVD, singular values at or below
    rcond * s_max counted as zero (gelsd/gelss); returns (x, rank, singular values)."""
    b = L.b
    m, n = a.shape[-2:]
    s, u, vt, info = gesdd(L, a, False, True)
    s = _nan_where_failed(L, s, info)
    real = s.dtype
    if rcond is None or rcond < 0:  # PyTorch's default / LAPACK's "machine precision"
        rcond = torch.finfo(real).eps * (max(m, n) if rcond is None else 1)
    (smax,) = b.reduce([s], [b.constant(0, real)], [s.rank - 1], lambda x, y: [b.binary("maximum", x, y)])
    tol = b.binary("multiply", b.broadcast_in_dim(smax, s.shape, list(range(smax.rank))), L.full(rcond, s.shape, real))
    keep = b.compare(s, tol, "GT")
    inv = b.select(keep, b.binary("divide", L.full(1, s.shape, real), s), L.zeros(s.shape, real))
    rank = _sum_last(L, L.to(keep, torch.int64), "add")
    c = matmul(L, _mH(L, u), rhs)  # U^H B, scaled row-wise by 1/s
    c = b.binary("multiply", c, L.to(b.broadcast_in_dim(inv, c.shape, list(range(inv.rank))), c.dtype))
    return matmul(L, _mH(L, vt), c), rank, s


@register(aten.linalg_lstsq.default)
def linalg_lstsq(
    L: NodeLowering, a: Value, rhs: Value, rcond: float | None = None, *, driver: str | None = None
) -> tuple[Value, Value, Value, Value]:
    b = L.b
    driver = _lstsq_driver(driver)
    sol_spec, res_spec, rank_spec, sv_spec = L.out
    m, n = a.shape[-2:]
    if rhs.rank == a.rank - 1:  # a batch of vectors
        rhs = b.reshape(rhs, rhs.shape + (1,))
    batch = tuple(torch.broadcast_shapes(a.shape[:-2], rhs.shape[:-2]))
    a = _bcast_batch(L, a, batch, 2)
    rhs = _bcast_batch(L, L.to(rhs, a.dtype), batch, 2)
    if 0 in a.shape or 0 in rhs.shape:
        raise NotImplementedError("torchtpu: linalg.lstsq of empty matrices is not implemented; compute it on the CPU")
    rank = sv = None
    if driver == "gels":
        x = _lstsq_qr(L, a, rhs)
    else:
        x, rank, sv = _lstsq_svd(L, a, rhs, rcond)
        if driver == "gelsy":
            # gelsy (QR with column pivoting) gives a full-rank A the QR solution; a
            # rank-deficient one the minimum-norm solution of its rank-r part, which the
            # SVD truncation gives too (the rank is decided from the singular values)
            full = b.compare(rank, L.full(min(m, n), rank.shape, torch.int64), "EQ")
            x = b.select(b.broadcast_in_dim(full, x.shape, list(range(full.rank))), _lstsq_qr(L, a, rhs), x)
    residuals = L.zeros(res_spec.shape, res_spec.dtype)
    if m > n and driver != "gelsy":
        r = b.binary("subtract", matmul(L, a, x), rhs)
        r2 = b.binary("multiply", r, conj(L, r))
        r2 = b.op1("stablehlo.real", [r2], r2.shape, res_spec.dtype) if is_complex(r2.dtype) else r2
        (residuals,) = b.reduce([r2], [b.constant(0, res_spec.dtype)], [r2.rank - 2], lambda p, q: [b.binary("add", p, q)])
    if rank is None:
        rank = L.zeros(rank_spec.shape, torch.int64)
    if driver not in ("gelsd", "gelss"):
        sv = L.zeros(sv_spec.shape, sv_spec.dtype)
    return b.reshape(x, sol_spec.shape), residuals, rank, sv


_register_missing_meta_kernels()


# -- general eigendecomposition -----------------------------------------------------------------
@register(aten.linalg_eig.default)
def linalg_eig(L: NodeLowering, a: Value) -> tuple[Value, Value]:
    w_spec, v_spec = L.out
    if _is_empty(a):
        return L.zeros(w_spec.shape, w_spec.dtype), L.zeros(v_spec.shape, v_spec.dtype)
    w, v, info = geev(L, a, True)
    return _nan_where_failed(L, w, info), _nan_where_failed(L, v, info)


@register(aten._linalg_eigvals.default)
def linalg_eigvals(L: NodeLowering, a: Value) -> Value:
    (w_spec,) = L.out
    if _is_empty(a):
        return L.zeros(w_spec.shape, w_spec.dtype)
    w, _, info = geev(L, a, False)
    return _nan_where_failed(L, w, info)
