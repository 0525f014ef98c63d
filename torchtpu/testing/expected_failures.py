"""Expected failures and skips of the conformance tests, as data (each with its reason).

Keys are ``(op_id, dtype, mode)``; ``None`` matches any dtype or mode. ``op_id`` is the
OpInfo name plus ``.variant`` when the entry has a variant (``round.decimals_3``);
``dtype`` is a short name (``"float32"``); ``mode`` is one of ``fwd``, ``grad``,
``inplace``, ``out``.

- ``XFAIL``: why a listed case fails, written by hand (a documented difference from the
  CPU, checked against a float64 reference, or a missing lowering). A case fails the run
  unless ``OBSERVED`` (``expected_failures_full.py``, recorded by ``make test-ops``) lists
  exactly how it fails and a reason here covers it; a listed case that passes fails the
  run too (strict xpass).
- ``SKIP``: the case does not run at all (the comparison is meaningless, e.g. random or
  uninitialised outputs, or running it would take too long).
- ``SKIPPED_DTYPES``: dtypes the platform does not support yet (one place to turn on).
- ``CORE_MISSING``: core ATen overloads that may have neither a rule nor a decomposition.
"""

from __future__ import annotations

import torch

Key = tuple[str, str | None, str | None]

# Dtypes the conformance run leaves out, and why. Delete a line to turn the dtype on.
SKIPPED_DTYPES: dict[torch.dtype, str] = {
    torch.complex32: "complex32 (chalf) has no XLA element type",
    torch.uint16: "uint16 is a storage-only dtype on the CPU (few kernels)",
    torch.uint32: "uint32 is a storage-only dtype on the CPU (few kernels)",
    torch.uint64: "uint64 is a storage-only dtype on the CPU (few kernels)",
}

# -- documented differences: each says what differs and why, against a float64 reference ----
_TIES = (
    "indices among equal values: with stable=False PyTorch leaves the order of equal elements unspecified; the CPU's "
    "sort (and topk's/kthvalue's partial selection) returns one order, tpu's sort is stable (lowest index first). The "
    "sorted values are identical; only the index output, and a gradient routed through it, differ. With stable=True "
    "the CPU and tpu indices are identical (checked on these samples' 8000-element inputs with ties, int8/uint8/bool/"
    "bfloat16/float16)"
)
_MODE = (
    "mode indices: the 3000-element sample has repeated values in this dtype and the CPU's std::sort (introsort, "
    "unstable beyond 16 elements) reports an arbitrary occurrence of the mode; tpu reports the last one (the values match; "
    "the gradient lands on the other occurrence)"
)
_F32_SUM_ORDER = (
    "float32 accumulation order: XLA:CPU's dot/convolution (Eigen contraction kernels) and FFT (ducc) accumulate in "
    "float32 as the CPU's MKL/oneDNN/pocketfft kernels do, but associate the sums differently; one sample differs from "
    "the CPU by a few float32 ulps and its summed error against float64 is within 1.5x of the CPU's (both ~1e-7 "
    "relative); PyTorch's own CUDA-vs-CPU test (test_compare_cpu) allows 1e-3 here"
)
_LAPACK_F32 = (
    "float32 LAPACK: tpu factors with the LAPACK kernels linked into XLA's CPU runtime, the CPU with MKL; both in "
    "float32, with different blocking, so the factors differ in their last bits and the backward's products of the "
    "factors (svd's has 1/(s_i^2 - s_j^2) terms) amplify that to a few elements beyond atol 1e-5 (relative <= 3e-4). "
    "Measured summed error against float64, tpu/CPU: lstsq 1.1x, pinv 1.14x, householder_product 1.5x, complex64 svd 1.3x "
    "(session 63: 4.7e-4 vs 3.6e-4; float32 svd's gradient now passes)"
)
_POW_F32 = (
    "pow in float32/complex64: XLA computes x**y as exp(y*log(x)) (complex: through the polar form) where the CPU calls "
    "std::pow; on the one large-magnitude element (|x**y| ~ 1e5-1e9) the results differ by 2e-6 relative, a float32 ulp "
    "or two (summed error against float64 1.85x the CPU's for complex64 __rpow__'s gradient; float32 pow's gradient, "
    "1.0x, passes: its entry was found stale in session 63)"
)
_COV_F16_GRAD = (
    "cov's float16 gradient with aweights (sample 24: a 3x2 input, aweights [0.26, 0.37]): one of the 8 gradient "
    "elements is exactly 0 in float64 and comes out as 2^-16 (1.5e-5) on the CPU, 2^-15 on tpu: residues of a "
    "cancellation rounded in float16 on both; summed error against float64 0.00537 on tpu, 0.00535 on the CPU"
)
_LINALG = (
    "LDL (Bunch-Kaufman) has no lowering: the XLA CPU runtime (0.10.2) registers no LAPACK sytrf/hetrf FFI target "
    "and no StableHLO algorithm is wired for it; the op raises NotImplementedError (TORCHTPU_CPU_FALLBACK=1 runs it on the host)"
)
_COMPLEX32 = "complex32 (ComplexHalf) has no XLA element type: a float16 complex result cannot live on tpu (raises, naming the supported dtypes)"
_SPARSE = "sparse layouts (COO/CSR) are not supported on tpu (dense only): the op raises"
_COMPLEX_LSE = "logsumexp/logcumsumexp of complex tensors are not lowered (raise NotImplementedError naming the CPU fallback)"
_SEGMENT_REDUCE = "aten::segment_reduce (a prototype op) has no lowering: raises NotImplementedError naming TORCHTPU_CPU_FALLBACK"
_HISTOGRAM_OUT = (
    "histogram's out= overload (histogram.bin_ct_out) has no lowering: raises NotImplementedError; the functional form works"
)
_ISTFT_WINDOW = (
    "istft's gradient with respect to the window: when the input also requires grad, the CPU's autograd returns None "
    "for the window (compared as zeros); tpu returns a gradient, which equals central finite differences of the CPU's "
    "float64 forward (1.3e-9 on sample 9) and the CPU's own window gradient when only the window requires grad"
)

_NORM_STATS = (
    "the saved statistics' dtype and shape: tpu returns save_mean/save_invstd (layer_norm's mean/rstd) in float32 for "
    "16-bit inputs, as CUDA's kernels and PyTorch's meta functions do (the accumulate type), and with shape [C] in eval "
    "mode (the meta function's shape), where the CPU returns them in the input's dtype and, in eval mode, empty; so "
    "out= statistics in a 16-bit dtype are refused with the CPU's own exact-dtype message ('expected scalar type Float "
    "but found Half'), which the CPU raises for float32 ones; the normalized output matches the CPU"
)
_ADDBMM_INPLACE = (
    "addbmm_ on a self that only broadcasts to the result (shape [1] or [] against [5, 10]): the CPU (and CUDA) resize "
    "self, because addbmm_ is addbmm_out(self, self); PyTorch's meta/decomposition refuses with RuntimeError ('output "
    "with shape [1] doesn't match the broadcast shape [5, 10]'), and so does tpu, with that RuntimeError"
)
_GRID_SAMPLE_GRAD = (
    "grid_sampler_2d's backward is autograd through a gather-based forward (torchtpu's for bilinear and nearest, "
    "PyTorch's decomposition for bicubic), not the CPU's fused backward kernel: 40 of 1120 elements differ by up to 7e-5, summed error against float64 equal to the CPU's to 3 digits "
    "(0.00258 both)"
)
_LOGCUMSUMEXP_GRAD = (
    "logcumsumexp's float32 gradient on a large-magnitude sample: tpu differentiates the log-step scan, the CPU uses its "
    "rescaled closed-form backward; one element differs by 1.8e-3 (2.3e-3 relative), summed error against float64 1.1x the CPU's"
)
_MATRIX_EXP_GRAD = (
    "matrix_exp's float32 gradient on sample #1 (5x5 matrices with 1-norms 26-29): PyTorch's backward exponentiates the "
    "10x10 block matrix [[A^T, G], [0, A^T]] with the same algorithm as the forward (degree-18 Taylor after scaling by a "
    "power of two, then squarings), and each squaring multiplies the matmuls' float32 rounding, whose summation order "
    "differs (XLA's dot, the CPU's BLAS): 7 of 125 elements differ by up to 2.3e-5 relative. Summed error against "
    "float64: the gradient tpu 0.228, CPU 0.139; on the same inputs the forward goes the other way (tpu 0.223, CPU 0.390) "
    "and the block matrix's whole exponential is as close (tpu 0.713, CPU 0.658)"
)
_I0E_16BIT = (
    "i0e grad in 16-bit: on a 5-element sample the CPU's scalar kernel evaluates calc_i0e in Half/BFloat16 arithmetic "
    "(vectors of 16+ go through float32, as tpu does), so i0e differs in its last 16-bit digits and the backward's "
    "i1e - sgn*i0e cancellation turns that into 1-10% relative error; forward and float32/float64 grads match"
)
_NORMALIZE_BF16 = (
    "bfloat16 normalize's gradient: the CPU's bf16 pow(x, -0.5) double-rounds on short tensors (torch.tensor([0.267578125]) "
    ".bfloat16().pow(-0.5) gives 1.9375, inside a long tensor 1.9297; float64: 1.93319) and pow(x, -2) rounds x*x to bf16 "
    "first; tpu rounds each once. With the CPU's pow rounding once, the CPU's gradient equals tpu's bit for bit"
)
_KL_DIV_F16 = (
    "float16 kl_div's gradient: the CPU's float16 xlogy rounds log(y) to float16 before the multiply, tpu's rounds once; "
    "one element of 12 differs by 6.1e-5"
)
_LOG_SOFTMAX_CHAIN_16BIT = (
    "16-bit cross_entropy, linear_cross_entropy (its reference path: linear, log_softmax, nll_loss) and masked.logsumexp: "
    "replaying every ATen op of each failing sample on tpu with the CPU's own inputs, the only ops whose results differ "
    "are log_softmax, logsumexp and nll_loss, and on every one tpu's is the closer to float64. The CPU's 16-bit kernels "
    "round intermediates to the dtype (both reproduced bit for bit): log_softmax over the last dim rounds "
    "sum(exp(x - max)) and its log to 16 bits before x - max - log(sum) (cross_entropy bf16 sample 19: at a row's "
    "maximum the CPU gives 0.0, float64 -0.002447, tpu -0.002441); logsumexp runs exp, sum, log and add as "
    "separate 16-bit ops; nll_loss sums the weighted losses in 16-bit partial sums (400 random 8x5 batches: summed "
    "error 23.9 bf16 / 3.3 f16 on the CPU, 13.8 / 1.86 on tpu, tpu closer on 177 / 179 and never farther). tpu "
    "computes each op in float32 and rounds once, as CUDA's kernels do. The loss's later 16-bit roundings (the class "
    "weight multiply, the backward's products) then double-round the two inputs either way: cross_entropy bf16 sample "
    "18, tpu's log-probability -6.03125 (float64 -6.0181; the CPU's -6.0) times the weight -8.0625 rounds to 48.75, "
    "the CPU's to 48.5 (float64 48.52), so on OpInfo's samples 1-7 elements end up to 3.6x farther. Not systematic: "
    "over 10 seeds of these samples (each floating input redrawn uniformly over its range), float64-arbitrated, tpu is "
    "the closer on cross_entropy bf16 grad 124 of 141 differing samples (summed error 0.846 vs the CPU's 0.862), f16 "
    "grad 120/137 (0.109 vs 0.117), bf16 fwd 35/56 (1.99 vs 1.78: three samples with weights near -8 dominate the sum), "
    "f16 fwd 42/52 (0.193 vs 0.294); linear_cross_entropy bf16 fwd "
    "228/296 (16.8 vs 24.7), f16 fwd 222/273 (1.82 vs 3.05), bf16 grad 429/566 (41.2 vs 43.7), f16 grad 430/565 (5.51 "
    "vs 5.89); masked.logsumexp bf16 grad 104/154 (0.623 vs 0.798), f16 grad 110/147 (0.088 vs 0.107)"
)
_SOFTMAX_OTHER_DIM_16BIT = (
    "float16 softmax's gradient over a dim that is not the last: the CPU's kernel for that layout rounds exp(x - max) "
    "to float16 before dividing by the (float32) sum, so its forward is not correctly rounded (sample 1, a 5x5 softmax "
    "over dim 0: 0.05133 where float64 gives 0.051348 and tpu, rounding once, 0.05136); the backward kernels agree bit "
    "for bit given the same forward output, so the gradients differ only through it, and by double rounding land "
    "either way. Float64-arbitrated over 80 seeds (inputs redrawn): the forward, tpu closer on all 80 differing "
    "samples; softmax's gradient tpu closer on 58 of 78 (summed error 0.0381 vs the CPU's 0.0394); masked.softmax's "
    "(40 seeds) 44 of 66 (0.0291 vs 0.0300)"
)
_LCE_CHUNKED_POLICY = (
    "linear_cross_entropy with options (the chunked path): PyTorch resolves LinearCrossEntropyOptions' 'auto' per "
    "device type (torch/nn/modules/linear_cross_entropy_options.py: _AUTO_DEFAULTS, _resolve_auto_acc_dtype): 'cpu' "
    "gets acc_policy='accurate' with float32 accumulation, a device type not in its table (tpu) the fallback "
    "'compact' with chunking 'aspect_ratio:2' and acc_dtype = the input's 16-bit dtype. So the same call accumulates "
    "logits, log-sum-exp and gradients in float16/bfloat16 on tpu and in float32 on the CPU: float16 sample 126's loss "
    "is 0.027924 on tpu, 0.027557 on the CPU, float64 0.027558. The CPU run with tpu's resolution gives tpu's "
    "result bit for bit on 221 of the 405 samples that differ in these 8 cases (2 variants x 2 dtypes x fwd/grad); "
    "172 more are samples whose options "
    "PyTorch ignores (K-dim weights, probability targets: the reference path, as in _LOG_SOFTMAX_CHAIN_16BIT below); "
    "the other 12 differ from that CPU run by the 16-bit matmuls' summation order with the same float64 error to 3 "
    "digits, or are the acc_dtype=float32 samples (accurate vs compact; no float64 reference runs them). Making tpu "
    "resolve 'auto' as the CPU does is a registration change (torchtpu registers no entry in that table); "
    "with acc_policy='accurate', acc_dtype=torch.float32 passed explicitly tpu equals the CPU on sample 126. "
)
_16BIT_SUMS = (
    "16-bit gradients downstream of a sum or product that tpu computes in float32 and rounds once. Replaying every "
    "ATen op of each failing sample on tpu with the CPU's inputs, the only ops that differ are, each with tpu's result "
    "the closer to float64: masked.prod's float16 prod (the CPU multiplies in float16, see _FLOAT16_PROD; sample 61: "
    "4078 vs the CPU's 4080, float64 4078.3), embedding_bag's bfloat16 mean bags (sample 19: summed error 0.074 vs "
    "0.134) and cov's float32 mm and sum (a few ulps: 102.127258 vs 102.127235, float64 102.127254). The gradients' "
    "later 16-bit roundings then double-round either way. Float64-arbitrated over 10 seeds (inputs redrawn over their "
    "ranges): masked.prod f16 grad, tpu closer on 68 of 129 differing samples, the CPU on 58; embedding_bag bf16 grad "
    "119 of 138 (summed error 14.2 vs 17.0); cov bf16 grad 40 of 66, the CPU 24 (0.6286 vs 0.6287)"
)

_KTHVALUE_CHECK_ORDER = (
    "check order: this error input both passes an out= that overlaps the input and a k out of range; the CPU's "
    "kthvalue checks the overlap first, tpu's argument checks (eager/validate.py) the range of k first. Both refuse "
    "the call with RuntimeError; only the message names the other problem"
)

_EXTREMAL_SUM_ORDER = (
    "summation order with cancellation of the dtype's largest values (extremal run; float32, float64 and bfloat16 "
    "alike; no value is wrong, both results are within the (n-1)*eps*sum|x| bound): for the row [M, -M, 1, -1, 0.5] "
    "(M = the dtype's max; exact sum 0.5) the CPU's cascade sum keeps 4 interleaved partial sums, so 0.5 joins M and "
    "is absorbed: ((M+0.5)+(-M))+(1+(-1)) = 0; tpu gets the exact 0.5. For [-0, M, -M, 1] reduced over two "
    "dimensions the CPU adds in memory order and gets the exact 1; XLA adds pairs across the two dimensions, so M+1 "
    "rounds to M in one pair and the result is 0. mean is the same divided by the count"
)
_EXTREMAL_HYPOT_FTZ = (
    "hypot(+-M, +-M) and the complex |(-M - Mj)| for M = the dtype's max (float32 3.4e38, float64 1.8e308, bfloat16 "
    "3.39e38; complex64/complex128 parts) in the subnormal sample, compared with the CPU under "
    "torch.set_flush_denormal(True): there the CPU's vectorised hypot returns M; the exact value sqrt(2)*M (4.81e38, "
    "2.54e308, 4.79e38) overflows the dtype and rounds to inf, which tpu returns (as does the CPU without the flag). "
    "float32, bfloat16 and complex64 pass since session 63 (the referee counts an overflow to the right infinity as "
    "no error); float64 and complex128 stay recorded (they still fail)"
)
_EXTREMAL_I1 = (
    "special.i1 in float32 on 8 < |x| < 9 (33 of 16384 elements): values near 1000 where one ulp is 6.1e-5 against an "
    "atol of 1e-4; both sides are up to 13.9 ulp from float64 (the series' error); summed error against float64 tpu "
    "0.266, CPU 0.263 — the difference is XLA's exp on [8, 9] (0.81 ulp vs glibc's 0.54)"
)
_EXTREMAL_FMOD_OVERFLOW = (
    "float64 fmod/remainder where x / y overflows: fmod(+-1.8e308, 0.5) and remainder(1.8e308, 2.2e-308) are exactly "
    "+-0 (1.8e308 is a multiple of both; C's fmod gives +-0.0), which tpu returns (XLA's remainder is C's fmod); the "
    "CPU's vectorised kernel computes x - trunc(x / y) * y with x / y = inf and returns NaN (a tensor of 1 or 3 "
    "elements takes its scalar path and gives 0.0). __rmod__ is remainder with the operands swapped. In the subnormal "
    "sample (CPU under torch.set_flush_denormal(True)) fmod(-2^-1024, +-2^-1024) and remainder(-2.5, -2^-1024) are "
    "exactly -0: the CPU's last elements go through std::fmod, which reads the bits despite the flag (-0.0); tpu "
    "flushes the subnormal divisor to 0 and returns NaN, as for fmod(x, 0)"
)
_EXTREMAL_F64_SUBNORMALS = (
    "float64 subnormals (+-2^-1024 in the subnormal sample) compared with the CPU under "
    "torch.set_flush_denormal(True); each side keeps the subnormal in some functions and flushes it in others. The "
    "CPU's glibc log/log2/log10 rescale it with integer arithmetic: log(2^-1024) = -709.78 (log2 -1024, log10 -308.25, "
    "logit likewise) and log(-2^-1024) = NaN, and sqrt(-2^-1024) is NaN: the exact values; tpu reads the input as +-0 "
    "(XLA:CPU's denormals-are-zero): -inf, and sqrt(-0) = -0. The other way round, tpu's frexp decodes the bits (+-0.5 "
    "* 2^-1023, exact) where the CPU reads 2^-1024 as 0 (frexp (0, 0)); and the CPU's pow under the flag keeps a "
    "negative subnormal base's sign: pow(-2^-1024, -2.5), pow(-2^-1024, +-2^-1024) and pow(-2^-1024, 2.2e-308) are NaN "
    "(the exact value: a negative base, a non-integer exponent), where tpu's pow flushes both operands, as its atan2 "
    "does, and gives (-0) ** y: inf, 1 and 0 (a session-63 change: it called libm on the unflushed values before, "
    "which gave pow(2^-1024, 0.5) = 1.6e-162, neither the flushed 0 nor the exact 7.5e-155). atan2: tpu flushes both operands (atan2(+-2^-1024, +-2^-1024) is atan2(+-0, +-0) = +-0 or +-pi, "
    "as the CPU's vectorised loop gives); the CPU's last 4 of 196 elements go through glibc's scalar atan2, which "
    "under the flag gives -pi/2 for atan2(-2^-1024, +-2^-1024) (neither the exact -pi/4, -3pi/4 nor the flushed -0, "
    "-pi); and for atan2(+-M, +-M) (M = 1.8e308) the CPU's vectorised atan2 under the flag returns +-0 or +-pi where "
    "the exact +-pi/4, +-3pi/4 is tpu's (and the CPU's without the flag)"
)
_EXTREMAL_RDIV_FTZ = (
    "float64 __rdiv__ is PyTorch's Tensor.__rdiv__, reciprocal(x) * y: two ops. reciprocal(+-1.8e308) = +-5.56e-309 is "
    "subnormal and tpu's reciprocal flushes it to 0 on output (XLA:CPU's flush-to-zero), so 1.8e308 .__rdiv__ "
    "(1.8e308) is 0 * 1.8e308 = 0 where the CPU gives 0.9999999999999999 (exact 1): the CPU is closer. torch.div "
    "(one op) gives 1 on tpu"
)
_EXTREMAL_RDIV_FTZ_F32 = (
    "float32 and bfloat16 __rdiv__ is PyTorch's Tensor.__rdiv__, reciprocal(x) * y: reciprocal(+-3.4e38) = +-2.9e-39 "
    "is subnormal and XLA:CPU flushes it to 0 on output, so inf .__rdiv__ ... gives inf * 0 = NaN where the CPU gives "
    "+-inf (and 3.4e38 / 3.4e38 gives 0, the CPU 1 (bfloat16: 0.996); torch.div, one op, gives 1 on tpu). Hidden "
    "until session 62 by the referee, which passed inf <= inf"
)
_LAGUERRE_INT_ROUNDING = (
    "special.laguerre_polynomial_l of integer inputs, computed in float32 by the three-term recurrence, n steps: "
    "each side rounds its own 2n operations and the errors accumulate differently. L_55(-1) is 188885.58 on tpu, "
    "188885.27 on the CPU, 188885.17 exact (rel. errors 2.2e-6 and 5e-7); L_127(1) is -0.27105087 on tpu (closer), "
    "-0.27105069 on the CPU, exact -0.27105090. Float inputs pass (their samples stop at n = 10)"
)
_FLOAT16_PROD = (
    "float16 prod: the CPU accumulates float16 products in float16, tpu in float32, rounding once. For the row "
    "[65504, -2.5, -0, 0.5, 0] the CPU's 65504 * -2.5 overflows to -inf and -inf * -0 is NaN; tpu returns 0, the "
    "exact product (float64: 0). Likewise prod([300, 300, 1/300]) is inf on the CPU, 300 on tpu (float64 300.06)"
)
_BF16_ZERO_TESTS = (
    "bfloat16 subnormals (+-2^-128 in the subnormal sample) compared with the CPU under "
    "torch.set_flush_denormal(True): tpu's arithmetic flushes them (they widen to float32 subnormals) but its tests "
    "against zero (bool, logical_not/and/or/xor, all, count_nonzero, the 0-norm) see them as nonzero, which is exact "
    "(bool(2^-128) is True; count_nonzero of the 15-element sample is 13); the CPU under the flag converts them to "
    "float32 zeros first (False; 11)"
)
_COMPLEX_IDENTITY_OPS = (
    "complex values with an infinite part through an operation by 1 or by the count: the CPU's add/sub compute x + "
    "alpha*y with a complex multiplication by alpha = 1 + 0j, its mean divides by the count as the complex n + 0j "
    "and its one-element prod multiplies by 1 + 0j, so an infinity times the zero part makes NaN: (inf+infj) + "
    "(inf+infj) is NaN+NaNj on the CPU and inf+infj (the exact sum) on tpu, which adds the parts; a mean of "
    "(-inf-infj) with finite values and a one-element prod of (-inf-0j) are -inf-infj and -inf-0j on tpu (exact), "
    "NaN+NaNj and -inf+NaNj on the CPU"
)
_COMPLEX_MUL_DIV = (
    "complex multiplication and division with an infinite or overflowing part: the CPU multiplies by the textbook "
    "formula and divides by Smith's algorithm (c10::complex), which give NaN when an operand is infinite; XLA's "
    "(tpu's) give C99 Annex G's values: 1/(inf+infj) and (-0-0j)/(NaN-inf j) are 0, (NaN-inf j)/(-M-Mj) is an "
    "infinity, (-inf-Mj)*(-M+1j) is inf-inf j (the CPU: inf+NaNj). So reciprocal, rsqrt (1/sqrt), __rdiv__, "
    "sigmoid(-inf+iy) = 1/(1+exp(inf-iy)) and silu(-M+iy) = z*sigmoid(z) are 0 on tpu (exact) where the CPU gives NaN. "
    "square is z * z: (-M-inf j)^2 is NaN+inf j on tpu, -inf+inf j on the CPU. In complex64, XLA:CPU also "
    "contracts the real part a*c - b*d into fma(a, c, -(b*d)) (the CPU rounds both products): where a*c = b*d "
    "the real part is the rounding error of b*d, (-501-501j) * (-1001.2-1001.2j) = -0.0126+1003202.4j on tpu, exactly "
    "1003202.4j on the CPU, both within float32's 6e-8 of |z|; elsewhere fma is the closer: (-501-501j) * "
    "(-1001.2-501j) has real part 250600.203 on tpu, 250600.219 on the CPU, 250600.206 exact"
)
_COMPLEX_FLUSHED = (
    "complex128 (complex64: log1p) in the subnormal sample (parts +-M = 1.8e308 and 2.2e-308; complex64 3.4e38 and "
    "1.2e-38) compared with the CPU under "
    "torch.set_flush_denormal(True), whose complex kernels then lose values tpu keeps: angle(-M-Mj) = -3pi/4 (tpu and "
    "the CPU without the flag; the CPU with it -pi), sgn(-M-Mj) = -(1+1j)/sqrt(2) (tpu; the CPU -1-1j with the flag, "
    "and -0-0j in the sample without subnormals: its |z| overflows) and sgn(2.2e-308 - Mj) = -1j (tpu; the CPU -0j), log1p(2.2e-308 - Mj) = 709.78 - "
    "1.5708j (tpu and the CPU without the flag; the CPU with it 0) and log1p(2.2e-308 - inf j) = inf - 1.5708j (tpu; "
    "the CPU NaN), softsign(-0 - Mj) = -Mj/(1+M) = -1j (tpu; the CPU -0-0j)"
)
_COMPLEX_POW = (
    "complex pow (float_power, __rpow__, ldexp = x * 2^y) at zeros, infinities and NaN: pow(+-0+-0j, +-0+-0j) and "
    "pow(NaN+NaNj, 0) are 1 on tpu (x^0 = 1 for every x, as real pow) and NaN on the CPU (glibc's cpow: exp(0 * log "
    "0) = exp(NaN)); with an infinite or NaN part in the exponent the CPU's cexp(y * clog(x)) recovers infinities in "
    "its C99 multiplication (pow(NaN-inf j, -inf+NaNj) = 0, pow(inf+infj, inf+NaNj) = inf+NaNj, ldexp(-0-0j, "
    "-inf+NaNj) = 0) where tpu's multiplication gives NaN; where both overflow ((-1e20-1e20j) * 2^(1001-501j)) the "
    "phase of y log x, about 1e3 rad for complex64 and up to 1e20 rad here, has no correct digits on either side and "
    "the signs of the infinite parts differ. Finite values match (the large-value sample included, (-501-501j) ** "
    "(-501+501j) = 0); in complex64 tpu's power is closer to complex128 than the CPU's cpowf on the random sample "
    "(summed error 2.3e13 vs 4.5e13)"
)
_COMPLEX_LOGADDEXP = (
    "complex logaddexp(-inf+NaNj, -inf+yj): the real parts tie at -inf; the CPU's kernel takes the NaN operand as the "
    "smaller and returns NaN+NaNj (its 'infectious NaN' rule), PyTorch's decomposition (torch._refs.logaddexp, which "
    "tpu runs) takes the other operand and returns it (-inf+yj): the real part, -inf, is exact; the imaginary part "
    "(the phase of exp(-inf)) is undetermined"
)

# The extremal run's failures by reason: {reason: {dtype: ops}}.
_EXTREMAL: dict[str, dict[str, tuple[str, ...]]] = {
    _EXTREMAL_SUM_ORDER: {
        d: ("sum", "nansum", "mean", "nanmean", "masked.sum", "masked.mean") for d in ("float32", "float64", "bfloat16")
    },
    _EXTREMAL_HYPOT_FTZ: {"float64": ("hypot",)}
    | {"complex128": ("abs",)},
    _EXTREMAL_I1: {"float32": ("special.i1",)},
    _EXTREMAL_FMOD_OVERFLOW: {"float64": ("fmod", "remainder", "__rmod__")},
    _EXTREMAL_F64_SUBNORMALS: {
        "float64": ("atan2", "frexp", "log", "log10", "log2", "logit", "sqrt", "pow", "float_power", "__rpow__")
    },
    _EXTREMAL_RDIV_FTZ: {"float64": ("__rdiv__",)},
    _EXTREMAL_RDIV_FTZ_F32: {"float32": ("__rdiv__",), "bfloat16": ("__rdiv__",)},
    _LAGUERRE_INT_ROUNDING: {d: ("special.laguerre_polynomial_l",) for d in ("int8", "int16", "int64", "uint8")},
    _FLOAT16_PROD: {"float16": ("prod",)},
    _BF16_ZERO_TESTS: {
        "bfloat16": ("logical_not", "logical_and", "logical_or", "logical_xor", "bool", "all", "count_nonzero")
        + ("linalg.vector_norm", "masked.norm")
    },
    _COMPLEX_IDENTITY_OPS: {
        d: ("add", "sub", "rsub", "__radd__", "__rsub__", "mean", "masked.mean", "masked.prod")
        for d in ("complex64", "complex128")
    },
    _COMPLEX_MUL_DIV: {
        "complex64": ("reciprocal", "rsqrt", "sigmoid", "nn.functional.silu.complex", "mul", "__rmul__", "square")
        + ("div.no_rounding_mode", "true_divide", "__rdiv__"),
        "complex128": ("mul", "__rmul__", "div.no_rounding_mode", "true_divide", "__rdiv__", "reciprocal", "rsqrt")
        + ("sigmoid", "nn.functional.silu.complex"),
    },
    _COMPLEX_FLUSHED: {"complex128": ("angle", "sgn", "log1p", "nn.functional.softsign"), "complex64": ("log1p",)},
    _COMPLEX_POW: {"complex64": ("pow", "float_power", "__rpow__", "ldexp"), "complex128": ("pow", "float_power", "__rpow__", "ldexp")},
    _COMPLEX_LOGADDEXP: {"complex64": ("logaddexp",), "complex128": ("logaddexp",)},
}

XFAIL: dict[Key, str] = {
    **{(op, d, "extremal"): reason for reason, by_dtype in _EXTREMAL.items() for d, ops in by_dtype.items() for op in ops},
    ("kthvalue", None, "errors"): _KTHVALUE_CHECK_ORDER,
    ("sort", None, None): _TIES,
    ("argsort", None, None): _TIES,
    ("msort", None, None): _TIES,
    ("topk", None, None): _TIES,
    ("kthvalue", None, None): _TIES,
    ("mode", None, None): _MODE,
    ("nn.functional.conv2d", None, None): _F32_SUM_ORDER,
    ("nn.functional.conv_transpose3d", None, None): _F32_SUM_ORDER,
    ("fft.hfft2", None, None): _F32_SUM_ORDER,
    ("stft", "float32", "grad"): _F32_SUM_ORDER,
    ("linalg.svd", None, "grad"): _LAPACK_F32,
    ("svd", None, "grad"): _LAPACK_F32,
    ("linalg.lstsq", None, "grad"): _LAPACK_F32,
    ("linalg.lstsq.grad_oriented", None, "grad"): _LAPACK_F32,
    ("linalg.pinv.hermitian", None, "grad"): _LAPACK_F32,
    ("linalg.householder_product", "float32", "grad"): _LAPACK_F32,
    ("triangular_solve", "float32", "grad"): _LAPACK_F32,
    ("__rpow__", "complex64", None): _POW_F32,
    ("cov", "float16", "grad"): _COV_F16_GRAD,
    ("linalg.ldl_factor", None, None): _LINALG,
    ("linalg.ldl_factor_ex", None, None): _LINALG,
    ("linalg.ldl_solve", None, None): _LINALG,
    ("complex", "float16", None): _COMPLEX32,
    ("view_as_complex", "float16", None): _COMPLEX32,
    ("to_sparse", None, None): _SPARSE,
    ("sparse.sampled_addmm", None, None): _SPARSE,
    ("sparse.mm.reduce", None, None): _SPARSE,
    ("logsumexp", "complex64", None): _COMPLEX_LSE,
    ("logsumexp", "complex128", None): _COMPLEX_LSE,
    ("masked.logsumexp", "complex64", None): _COMPLEX_LSE,
    ("masked.logsumexp", "complex128", None): _COMPLEX_LSE,
    ("logcumsumexp", "complex64", None): _COMPLEX_LSE,
    ("logcumsumexp", "complex128", None): _COMPLEX_LSE,
    ("_segment_reduce.lengths", None, None): _SEGMENT_REDUCE,
    ("_segment_reduce.offsets", None, None): _SEGMENT_REDUCE,
    ("histogram", None, "out"): _HISTOGRAM_OUT,
    ("istft", None, "grad"): _ISTFT_WINDOW,
    ("_batch_norm_with_update", None, "fwd"): _NORM_STATS,
    ("_native_batch_norm_legit", None, None): _NORM_STATS,
    ("native_batch_norm", None, None): _NORM_STATS,
    ("native_layer_norm", None, "fwd"): _NORM_STATS,
    ("addbmm", None, "inplace"): _ADDBMM_INPLACE,
    ("grid_sampler_2d", "float32", "grad"): _GRID_SAMPLE_GRAD,
    ("logcumsumexp", "float32", "grad"): _LOGCUMSUMEXP_GRAD,
    ("logcumsumexp", "float32", "compile-grad"): _LOGCUMSUMEXP_GRAD,
    ("matrix_exp", "float32", "grad"): _MATRIX_EXP_GRAD,
    ("matrix_exp", "float32", "compile-grad"): _MATRIX_EXP_GRAD,
    ("special.i0e", None, "grad"): _I0E_16BIT,
    ("nn.functional.normalize", "bfloat16", "grad"): _NORMALIZE_BF16,
    ("nn.functional.kl_div", "float16", "grad"): _KL_DIV_F16,
    ("nn.functional.cross_entropy", None, "grad"): _LOG_SOFTMAX_CHAIN_16BIT,
    ("nn.functional.linear_cross_entropy", None, None): _LOG_SOFTMAX_CHAIN_16BIT,
    ("nn.functional.linear_cross_entropy.chunked", None, None): _LCE_CHUNKED_POLICY + _LOG_SOFTMAX_CHAIN_16BIT,
    ("nn.functional.linear_cross_entropy.chunked_none", None, None): _LCE_CHUNKED_POLICY + _LOG_SOFTMAX_CHAIN_16BIT,
    ("masked.logsumexp", None, "grad"): _LOG_SOFTMAX_CHAIN_16BIT,
    ("masked.softmax", "float16", "grad"): _SOFTMAX_OTHER_DIM_16BIT,
    ("softmax", "float16", "grad"): _SOFTMAX_OTHER_DIM_16BIT,
    ("cov", "bfloat16", "grad"): _16BIT_SUMS,
    ("nn.functional.embedding_bag", "bfloat16", "grad"): _16BIT_SUMS,
    ("masked.prod", "float16", "grad"): _16BIT_SUMS,
}

_RECURRENCE_2_31_STEPS = (
    "int32 extremal values make the degree n = 2^31 - 1 (2^31 once the CPU's kernel has taken it as float32): the "
    "CPU's three-term recurrence runs 2^31 steps for each x whose values stay finite (x = 1, 2, -1), over 60 s and "
    "about 15 minutes by its 0.46 s per 2^20 steps; tpu's while loop does the same steps (0.61 s per 2^20). The int8/"
    "int16 extremal samples run these ops at once"
)

SKIP: dict[Key, str] = {
    ("special.laguerre_polynomial_l", "int32", "extremal"): _RECURRENCE_2_31_STEPS,
    ("special.legendre_polynomial_p", "int32", "extremal"): _RECURRENCE_2_31_STEPS,
    (
        "as_strided.partial_views",
        None,
        None,
    ): "the sample is a view into a larger storage and as_strided reads outside the view; .to('tpu') copies only the view, so the tpu storage differs (not comparable)",
    ("chalf", None, None): "complex32 (chalf) has no XLA element type",
    ("randn", None, None): "random: the device generator (Philox) is not bit-identical to the CPU generator",
    ("randint", None, None): "random: the device generator (Philox) is not bit-identical to the CPU generator",
    (
        "nn.functional.alpha_dropout",
        None,
        None,
    ): "random: the dropout mask comes from the device generator (Philox), not the CPU's; tests/test_model_ops.py checks dropout's statistics",
}

# How each listed case fails (samples, kind, error bound), recorded by the full run: a
# case fails the run unless it fails exactly so and XFAIL above says why.
from .expected_failures_full import OBSERVED  # noqa: E402, F401

# Core ATen overloads that may have neither a rule nor a decomposition, and why.
CORE_MISSING: dict[str, str] = {}


def lookup(table: dict[Key, str], op_id: str, dtype: str | None, mode: str | None) -> str | None:
    """The reason ``table`` gives for this case (most specific key first), or None."""
    for key in ((op_id, dtype, mode), (op_id, dtype, None), (op_id, None, mode), (op_id, None, None)):
        reason = table.get(key)
        if reason is not None:
            return reason
    return None
