"""A small typed builder that writes StableHLO as MLIR text.

This is the only module that knows StableHLO syntax. Every op is printed in MLIR's
generic form (``%3 = "stablehlo.add"(%1, %2) : (t, t) -> t``): one uniform shape for
all ops, accepted by every MLIR parser version, and easy to read in golden tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .types import element_type, is_complex, is_float, numpy_dtype, tensor_type

Shape = tuple[int, ...]


class Value:
    """An SSA value: a name plus the static shape and torch dtype of the tensor."""

    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name: str, shape: Sequence[int], dtype: torch.dtype):
        self.name = name
        self.shape: Shape = tuple(int(d) for d in shape)
        self.dtype = dtype

    @property
    def type(self) -> str:
        return tensor_type(self.shape, self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"Value({self.name}: {self.type})"


def i64_array(values: Sequence[int]) -> str:
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in values) if values else "") + ">"


def i64_list(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def _float_bits(x: float, dtype: torch.dtype) -> str:
    """Exact hexadecimal literal for a float in ``dtype`` (handles inf/nan/-0.0). A value
    beyond the dtype's range is inf, as the CPU's unchecked casts make it (the checked
    conversions are eager/scalar_range.py's), without NumPy's overflow warning."""
    with np.errstate(over="ignore"):
        arr = np.asarray(x, dtype=numpy_dtype(dtype))
    width = arr.dtype.itemsize * 2
    return "0x" + format(int.from_bytes(arr.tobytes(), "little"), f"0{width}X")


def scalar_literal(x: bool | int | float | complex, dtype: torch.dtype) -> str:
    if dtype is torch.bool:
        return "true" if x else "false"
    if is_complex(dtype):
        part = torch.float32 if dtype is torch.complex64 else torch.float64
        c = complex(x)
        return f"({_float_bits(c.real, part)}, {_float_bits(c.imag, part)})"
    if is_float(dtype):
        return _float_bits(float(x), dtype)
    # an integer outside the dtype's range wraps as a C cast would (uint8 -1 -> 255):
    # StableHLO rejects an out-of-range literal
    bits = dtype.itemsize * 8
    v = int(x) & ((1 << bits) - 1)
    if dtype.is_signed and v >= 1 << (bits - 1):
        v -= 1 << bits
    return str(v)


class Builder:
    """Accumulates the body of one ``func.func @main`` and prints the module."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._indent = "    "
        self._count = 0
        self.params: list[Value] = []
        self._param_attrs: list[str] = []
        self._functions: dict[str, tuple[str, str]] = {}  # key -> (symbol to call, private functions' text)

    # -- names and params ---------------------------------------------------
    def _fresh(self) -> str:
        self._count += 1
        return f"%v{self._count}"

    def param(self, shape: Sequence[int], dtype: torch.dtype, attrs: str = "") -> Value:
        v = Value(f"%arg{len(self.params)}", shape, dtype)
        self.params.append(v)
        self._param_attrs.append(attrs)
        return v

    def set_param_attr(self, index: int, attrs: str) -> None:
        self._param_attrs[index] = attrs

    # -- generic op emission ------------------------------------------------
    def op(
        self,
        name: str,
        operands: Sequence[Value],
        results: Sequence[tuple[Sequence[int], torch.dtype]],
        attrs: str = "",
        regions: Sequence[str] = (),
    ) -> list[Value]:
        outs = [Value(self._fresh(), s, d) for s, d in results]
        lhs = ""
        if outs:
            lhs = ", ".join(o.name for o in outs) + " = "
        args = ", ".join(v.name for v in operands)
        reg = ""
        if regions:
            reg = " (" + ", ".join(regions) + ")"
        attr = f" {{{attrs}}}" if attrs else ""
        in_types = ", ".join(v.type for v in operands)
        out_types = ", ".join(o.type for o in outs)
        if len(outs) != 1:
            out_types = f"({out_types})"
        self._lines.append(
            f'{self._indent}{lhs}"{name}"({args}){reg}{attr} : ({in_types}) -> {out_types}'
        )
        return outs

    def op1(
        self,
        name: str,
        operands: Sequence[Value],
        shape: Sequence[int],
        dtype: torch.dtype,
        attrs: str = "",
        regions: Sequence[str] = (),
    ) -> Value:
        return self.op(name, operands, [(shape, dtype)], attrs, regions)[0]

    def region(
        self, arg_types: Sequence[tuple[Sequence[int], torch.dtype]], body: Callable[..., Sequence[Value]]
    ) -> str:
        """Text of a one-block region. ``body`` receives the block arguments as Values
        and returns the Values to yield with ``stablehlo.return``."""
        saved_lines, saved_indent = self._lines, self._indent
        self._lines, self._indent = [], saved_indent + "  "
        args = [Value(self._fresh(), s, d) for s, d in arg_types]
        results = list(body(*args))
        rets = ", ".join(r.name for r in results)
        rtypes = ", ".join(r.type for r in results)
        self._lines.append(f'{self._indent}"stablehlo.return"({rets}) : ({rtypes}) -> ()')
        header = "^bb0(" + ", ".join(f"{a.name}: {a.type}" for a in args) + "):"
        text = "{\n" + saved_indent + " " + header + "\n" + "\n".join(self._lines) + "\n" + saved_indent + "}"
        self._lines, self._indent = saved_lines, saved_indent
        return text

    # -- common ops ----------------------------------------------------------
    def constant(self, value: bool | int | float | complex, dtype: torch.dtype, shape: Sequence[int] = ()) -> Value:
        lit = scalar_literal(value, dtype)
        t = tensor_type(tuple(shape), dtype)
        return self.op1("stablehlo.constant", [], shape, dtype, f"value = dense<{lit}> : {t}")

    def constant_array(self, array: np.ndarray, dtype: torch.dtype) -> Value:
        """A non-splat constant from a numpy array (raw little-endian hex data)."""
        arr = np.ascontiguousarray(np.asarray(array, dtype=numpy_dtype(dtype)))
        if arr.size == 0:  # nothing to spell out: a splat of no elements
            return self.constant(0, dtype, arr.shape)
        if dtype is torch.bool:  # i1 has no byte layout in hex form: spell it as u8, then convert
            return self.convert(self.constant_array(arr.astype(np.uint8), torch.uint8), torch.bool)
        t = tensor_type(arr.shape, dtype)
        return self.op1("stablehlo.constant", [], arr.shape, dtype, f'value = dense<"0x{arr.tobytes().hex().upper()}"> : {t}')

    def unary(self, name: str, x: Value, dtype: torch.dtype | None = None) -> Value:
        return self.op1(f"stablehlo.{name}", [x], x.shape, dtype or x.dtype)

    def binary(self, name: str, x: Value, y: Value) -> Value:
        return self.op1(f"stablehlo.{name}", [x, y], x.shape, x.dtype)

    def chlo(self, name: str, *xs: Value, dtype: torch.dtype | None = None) -> Value:
        return self.op1(f"chlo.{name}", xs, xs[0].shape, dtype or xs[0].dtype)

    def convert(self, x: Value, dtype: torch.dtype) -> Value:
        if x.dtype == dtype:
            return x
        return self.op1("stablehlo.convert", [x], x.shape, dtype)

    def bitcast_convert(self, x: Value, shape: Sequence[int], dtype: torch.dtype) -> Value:
        return self.op1("stablehlo.bitcast_convert", [x], shape, dtype)

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        if x.shape == shape:
            return x
        return self.op1("stablehlo.reshape", [x], shape, x.dtype)

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        perm = [int(p) for p in perm]
        if perm == list(range(x.rank)):
            return x
        shape = [x.shape[p] for p in perm]
        return self.op1("stablehlo.transpose", [x], shape, x.dtype, f"permutation = {i64_array(perm)}")

    def broadcast_in_dim(self, x: Value, shape: Sequence[int], dims: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        if x.shape == shape and list(dims) == list(range(len(shape))):
            return x
        return self.op1(
            "stablehlo.broadcast_in_dim", [x], shape, x.dtype, f"broadcast_dimensions = {i64_array(dims)}"
        )

    def slice(self, x: Value, start: Sequence[int], limit: Sequence[int], strides: Sequence[int] | None = None) -> Value:
        strides = list(strides) if strides is not None else [1] * x.rank
        if list(start) == [0] * x.rank and tuple(limit) == x.shape and strides == [1] * x.rank:
            return x
        shape = [max(0, -(-(lim - s) // st)) for s, lim, st in zip(start, limit, strides)]
        attrs = (
            f"start_indices = {i64_array(start)}, limit_indices = {i64_array(limit)}, strides = {i64_array(strides)}"
        )
        return self.op1("stablehlo.slice", [x], shape, x.dtype, attrs)

    def concatenate(self, xs: Sequence[Value], dim: int) -> Value:
        if len(xs) == 1:
            return xs[0]
        shape = list(xs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in xs)
        return self.op1("stablehlo.concatenate", xs, shape, xs[0].dtype, f"dimension = {dim} : i64")

    def pad(self, x: Value, value: Value, low: Sequence[int], high: Sequence[int], interior: Sequence[int] | None = None) -> Value:
        interior = list(interior) if interior is not None else [0] * x.rank
        shape = [lo + hi + d + max(0, d - 1) * it for d, lo, hi, it in zip(x.shape, low, high, interior)]
        attrs = (
            f"edge_padding_low = {i64_array(low)}, edge_padding_high = {i64_array(high)}, "
            f"interior_padding = {i64_array(interior)}"
        )
        return self.op1("stablehlo.pad", [x, value], shape, x.dtype, attrs)

    def iota(self, shape: Sequence[int], dim: int, dtype: torch.dtype) -> Value:
        return self.op1("stablehlo.iota", [], shape, dtype, f"iota_dimension = {dim} : i64")

    def compare(self, x: Value, y: Value, direction: str) -> Value:
        dt = x.dtype
        if is_float(dt) or is_complex(dt):
            ctype = "FLOAT"
        elif dt is torch.bool or element_type(dt).startswith("ui"):
            ctype = "UNSIGNED"
        else:
            ctype = "SIGNED"
        attrs = (
            f"comparison_direction = #stablehlo<comparison_direction {direction}>, "
            f"compare_type = #stablehlo<comparison_type {ctype}>"
        )
        return self.op1("stablehlo.compare", [x, y], x.shape, torch.bool, attrs)

    def select(self, pred: Value, on_true: Value, on_false: Value) -> Value:
        return self.op1("stablehlo.select", [pred, on_true, on_false], on_true.shape, on_true.dtype)

    def clamp(self, lo: Value, x: Value, hi: Value) -> Value:
        return self.op1("stablehlo.clamp", [lo, x, hi], x.shape, x.dtype)

    def reduce(
        self,
        xs: Sequence[Value],
        inits: Sequence[Value],
        dims: Sequence[int],
        body: Callable[..., Sequence[Value]],
    ) -> list[Value]:
        """Variadic reduce; ``body(acc0.., x0..)`` combines scalars (0-d Values)."""
        dims = sorted(int(d) for d in dims)
        out_shape = [d for i, d in enumerate(xs[0].shape) if i not in dims]
        arg_types = [((), v.dtype) for v in inits] * 2
        region = self.region(arg_types, body)
        return self.op(
            "stablehlo.reduce",
            list(xs) + list(inits),
            [(out_shape, v.dtype) for v in inits],
            f"dimensions = {i64_array(dims)}",
            [region],
        )

    def dot_general(
        self,
        lhs: Value,
        rhs: Value,
        lhs_contract: Sequence[int],
        rhs_contract: Sequence[int],
        lhs_batch: Sequence[int] = (),
        rhs_batch: Sequence[int] = (),
        out_dtype: torch.dtype | None = None,
        precision: str = "DEFAULT",
    ) -> Value:
        batch = [lhs.shape[d] for d in lhs_batch]
        lfree = [d for i, d in enumerate(lhs.shape) if i not in lhs_batch and i not in lhs_contract]
        rfree = [d for i, d in enumerate(rhs.shape) if i not in rhs_batch and i not in rhs_contract]
        attrs = (
            "dot_dimension_numbers = #stablehlo.dot<"
            f"lhs_batching_dimensions = {i64_list(lhs_batch)}, rhs_batching_dimensions = {i64_list(rhs_batch)}, "
            f"lhs_contracting_dimensions = {i64_list(lhs_contract)}, "
            f"rhs_contracting_dimensions = {i64_list(rhs_contract)}>, "
            f"precision_config = [#stablehlo<precision {precision}>, #stablehlo<precision {precision}>]"
        )
        return self.op1("stablehlo.dot_general", [lhs, rhs], batch + lfree + rfree, out_dtype or lhs.dtype, attrs)

    def gather(
        self,
        operand: Value,
        indices: Value,
        offset_dims: Sequence[int],
        collapsed_slice_dims: Sequence[int],
        start_index_map: Sequence[int],
        index_vector_dim: int,
        slice_sizes: Sequence[int],
        out_shape: Sequence[int],
        operand_batching_dims: Sequence[int] = (),
        start_indices_batching_dims: Sequence[int] = (),
    ) -> Value:
        attrs = (
            "dimension_numbers = #stablehlo.gather<"
            f"offset_dims = {i64_list(offset_dims)}, collapsed_slice_dims = {i64_list(collapsed_slice_dims)}, "
            f"operand_batching_dims = {i64_list(operand_batching_dims)}, "
            f"start_indices_batching_dims = {i64_list(start_indices_batching_dims)}, "
            f"start_index_map = {i64_list(start_index_map)}, index_vector_dim = {index_vector_dim}>, "
            f"indices_are_sorted = false, slice_sizes = {i64_array(slice_sizes)}"
        )
        return self.op1("stablehlo.gather", [operand, indices], out_shape, operand.dtype, attrs)

    def scatter(
        self,
        operand: Value,
        indices: Value,
        updates: Value,
        update_window_dims: Sequence[int],
        inserted_window_dims: Sequence[int],
        scatter_dims_to_operand_dims: Sequence[int],
        index_vector_dim: int,
        combine: Callable[[Value, Value], Value] | None = None,
        input_batching_dims: Sequence[int] = (),
        scatter_indices_batching_dims: Sequence[int] = (),
    ) -> Value:
        """``combine(old, new)``; None means overwrite."""

        def body(old: Value, new: Value) -> list[Value]:
            return [combine(old, new) if combine else new]

        region = self.region([((), operand.dtype), ((), operand.dtype)], body)
        attrs = (
            "scatter_dimension_numbers = #stablehlo.scatter<"
            f"update_window_dims = {i64_list(update_window_dims)}, "
            f"inserted_window_dims = {i64_list(inserted_window_dims)}, "
            f"input_batching_dims = {i64_list(input_batching_dims)}, "
            f"scatter_indices_batching_dims = {i64_list(scatter_indices_batching_dims)}, "
            f"scatter_dims_to_operand_dims = {i64_list(scatter_dims_to_operand_dims)}, "
            f"index_vector_dim = {index_vector_dim}>, indices_are_sorted = false, unique_indices = false"
        )
        return self.op1("stablehlo.scatter", [operand, indices, updates], operand.shape, operand.dtype, attrs, [region])

    def dynamic_slice(self, x: Value, starts: Sequence[Value], sizes: Sequence[int]) -> Value:
        return self.op1("stablehlo.dynamic_slice", [x, *starts], sizes, x.dtype, f"slice_sizes = {i64_array(sizes)}")

    def dynamic_update_slice(self, x: Value, update: Value, starts: Sequence[Value]) -> Value:
        return self.op1("stablehlo.dynamic_update_slice", [x, update, *starts], x.shape, x.dtype)

    def reduce_window(
        self,
        xs: Sequence[Value],
        inits: Sequence[Value],
        window: Sequence[int],
        strides: Sequence[int],
        padding: Sequence[tuple[int, int]],
        body: Callable[..., Sequence[Value]],
        base_dilations: Sequence[int] | None = None,
        window_dilations: Sequence[int] | None = None,
    ) -> list[Value]:
        rank = xs[0].rank
        base_dilations = list(base_dilations or [1] * rank)
        window_dilations = list(window_dilations or [1] * rank)
        out_shape = []
        for d in range(rank):
            size = (xs[0].shape[d] - 1) * base_dilations[d] + 1 + padding[d][0] + padding[d][1]
            eff = (window[d] - 1) * window_dilations[d] + 1
            out_shape.append(max(0, (size - eff) // strides[d] + 1))
        pad = _pad_literal(padding)
        region = self.region([((), v.dtype) for v in inits] * 2, body)
        attrs = (
            f"window_dimensions = {i64_array(window)}, window_strides = {i64_array(strides)}, "
            f"base_dilations = {i64_array(base_dilations)}, window_dilations = {i64_array(window_dilations)}, "
            f"padding = {pad}"
        )
        return self.op("stablehlo.reduce_window", list(xs) + list(inits), [(out_shape, v.dtype) for v in inits], attrs, [region])

    def sort(self, xs: Sequence[Value], dim: int, comparator: Callable[..., Sequence[Value]], stable: bool = True) -> list[Value]:
        arg_types = []
        for v in xs:
            arg_types += [((), v.dtype), ((), v.dtype)]
        region = self.region(arg_types, comparator)
        attrs = f"dimension = {dim} : i64, is_stable = {'true' if stable else 'false'}"
        return self.op("stablehlo.sort", xs, [(v.shape, v.dtype) for v in xs], attrs, [region])

    def custom_call(
        self,
        target: str,
        operands: Sequence[Value],
        results: Sequence[tuple[Sequence[int], torch.dtype]],
        config: dict[str, str] | None = None,
        operand_layouts: Sequence[Sequence[int]] | None = None,
        result_layouts: Sequence[Sequence[int]] | None = None,
        aliases: dict[int, int] | None = None,
    ) -> list[Value]:
        """A typed-FFI custom call (``api_version = 4``). ``config`` holds the handler's
        attributes as MLIR attribute text (``{"mode": "65 : ui8"}``); layouts are
        minor-to-major dimension lists; ``aliases`` maps result index -> operand index."""
        cfg = ", ".join(f"{k} = {v}" for k, v in (config or {}).items())
        attrs = [f'call_target_name = "{target}"', "api_version = 4 : i32", f"backend_config = {{{cfg}}}"]
        if operand_layouts is not None:
            attrs.append(f"operand_layouts = [{', '.join(_layout(lay) for lay in operand_layouts)}]")
        if result_layouts is not None:
            attrs.append(f"result_layouts = [{', '.join(_layout(lay) for lay in result_layouts)}]")
        if aliases:
            items = ", ".join(  # a single result is not a tuple: its index path is empty
                f"#stablehlo.output_operand_alias<output_tuple_indices = [{r if len(results) > 1 else ''}], "
                f"operand_index = {o}, operand_tuple_indices = []>"
                for r, o in aliases.items()
            )
            attrs.append(f"output_operand_aliases = [{items}]")
        return self.op("stablehlo.custom_call", operands, results, ", ".join(attrs))

    def while_loop(
        self,
        init: Sequence[Value],
        cond: Callable[..., Value],
        body: Callable[..., Sequence[Value]],
    ) -> list[Value]:
        """``stablehlo.while`` over the loop state ``init``. ``cond(*state)`` returns a 0-d
        bool Value (keep looping while true); ``body(*state)`` returns the next state, with
        the same shapes and dtypes. Both regions see only the state (no implicit captures):
        carry every loop-invariant tensor in the state."""
        types = [(v.shape, v.dtype) for v in init]
        cond_region = self.region(types, lambda *s: [cond(*s)])
        body_region = self.region(types, body)
        return self.op("stablehlo.while", init, types, "", [cond_region, body_region])

    def fft(self, x: Value, fft_type: str, lengths: Sequence[int], shape: Sequence[int], dtype: torch.dtype) -> Value:
        """``stablehlo.fft`` over the trailing ``len(lengths)`` dims (FFT, IFFT, RFFT, IRFFT)."""
        attrs = f"fft_type = #stablehlo<fft_type {fft_type}>, fft_length = {i64_array(lengths)}"
        return self.op1("stablehlo.fft", [x], shape, dtype, attrs)

    # -- private functions (custom kernels, torchtpu.kernels) ----------------------
    def add_functions(self, key: str, render: Callable[[str], tuple[str, str]]) -> str:
        """Add private functions to the module once per ``key``; returns the symbol to call.

        ``render(prefix)`` returns ``(symbol, text)``: the functions' text with every symbol
        they define starting with ``prefix``, which is unique to this key in this module,
        so two kernels (or one kernel's functions) never collide with each other or @main."""
        entry = self._functions.get(key)
        if entry is None:
            entry = self._functions[key] = render(f"k{len(self._functions)}_")
        return entry[0]

    def call(self, callee: str, operands: Sequence[Value], results: Sequence[tuple[Sequence[int], torch.dtype]]) -> list[Value]:
        """``func.call`` of a function added with :meth:`add_functions`."""
        return self.op("func.call", operands, results, f"callee = @{callee}")

    # -- module ---------------------------------------------------------------
    def module(self, outputs: Sequence[Value], name: str = "main") -> str:
        params = ", ".join(
            f"{p.name}: {p.type}" + (f" {{{a}}}" if a else "") for p, a in zip(self.params, self._param_attrs)
        )
        out_types = ", ".join(o.type for o in outputs)
        rets = ", ".join(o.name for o in outputs)
        body = "\n".join(self._lines)
        return (
            f"module @{name} {{\n  func.func public @main({params}) -> ({out_types}) {{\n{body}\n"
            f'    "func.return"({rets}) : ({out_types}) -> ()\n  }}\n{self._function_text()}}}\n'
        )

    def _function_text(self) -> str:
        return "".join(text.rstrip("\n") + "\n" for _, text in self._functions.values())

    # -- cross-replica collectives (replica mode: no channel handles) --------------------
    @staticmethod
    def _pairs(rows: Sequence[Sequence[int]]) -> str:
        """``dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>`` (replica groups, permute pairs)."""
        width = len(rows[0]) if rows else 0
        return f"dense<[{', '.join(i64_list(r) for r in rows)}]> : tensor<{len(rows)}x{width}xi64>"

    def replica_id(self) -> Value:
        return self.op1("stablehlo.replica_id", [], (), torch.uint32)

    def all_reduce(self, x: Value, groups: Sequence[Sequence[int]], combine: Callable[[Value, Value], Value]) -> Value:
        """``combine(a, b)`` merges two 0-d Values of ``x``'s dtype."""
        region = self.region([((), x.dtype), ((), x.dtype)], lambda a, b: [combine(a, b)])
        return self.op1("stablehlo.all_reduce", [x], x.shape, x.dtype, f"replica_groups = {self._pairs(groups)}", [region])

    def all_gather(self, x: Value, dim: int, groups: Sequence[Sequence[int]]) -> Value:
        shape = list(x.shape)
        shape[dim] *= len(groups[0])
        attrs = f"all_gather_dim = {dim} : i64, replica_groups = {self._pairs(groups)}"
        return self.op1("stablehlo.all_gather", [x], shape, x.dtype, attrs)

    def all_to_all(self, x: Value, split_dim: int, concat_dim: int, groups: Sequence[Sequence[int]]) -> Value:
        n = len(groups[0])
        shape = list(x.shape)
        shape[split_dim] //= n
        shape[concat_dim] *= n
        attrs = (
            f"split_dimension = {split_dim} : i64, concat_dimension = {concat_dim} : i64, split_count = {n} : i64, "
            f"replica_groups = {self._pairs(groups)}"
        )
        return self.op1("stablehlo.all_to_all", [x], shape, x.dtype, attrs)

    def collective_permute(self, x: Value, pairs: Sequence[tuple[int, int]]) -> Value:
        """Replica ``src`` sends ``x`` to ``dst`` for each pair; a replica no pair targets gets zeros."""
        return self.op1("stablehlo.collective_permute", [x], x.shape, x.dtype, f"source_target_pairs = {self._pairs(pairs)}")


def _layout(dims: Sequence[int]) -> str:
    if not dims:
        return "dense<> : tensor<0xindex>"
    return f"dense<[{', '.join(str(int(d)) for d in dims)}]> : tensor<{len(dims)}xindex>"


def _pad_literal(padding: Sequence[tuple[int, int]]) -> str:
    rows = ", ".join(f"[{int(lo)}, {int(hi)}]" for lo, hi in padding)
    return f"dense<[{rows}]> : tensor<{len(padding)}x2xi64>"


def prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)
