// C++ versions of what every op and every compiled-graph call does per tensor,
// where Python's own cost is most of the time of a small step (issue 12's measurements):
//
//   new_tensor(cell, sizes, strides, offset, dtype)
//       a tpu tensor over a new storage with a unique opaque data pointer, carrying
//       ``cell`` (the storage's device buffer, torchtpu/tensor/storage.py) as ``_cell``
//       on the storage's Python object; the Python path needs a factory call, a storage
//       constructor and a redispatched ``set_`` for the same (2.6 us against 0.5 us);
//   fake_pointer(nbytes)
//       the next opaque data pointer (one counter for both paths);
//   graph_key(args, key, cells, slot_of)
//       the cache key entries of a compiled graph's arguments (torchtpu/compile/
//       fx_lowering.py ``_collect``) when every argument is a plain tpu tensor, an int or
//       None; False (nothing usable appended) for anything else, which Python handles;
//   same_graph_key(args, key, cells, slot_of)
//       whether those arguments have an earlier call's whole key (but its precision), checked
//       without building it: a training step calls each graph with the same geometry;
//   eager_keys(tensors, cells, slot_of, seen, runtime_offset, offsets)
//       the same for an eager op's tensor arguments (torchtpu/eager/dispatch.py
//       ``_Call.tensor``), whose entries also normalize size-1 strides and make a nonzero
//       storage offset a runtime operand;
//   collect_call(...)
//       an eager op's whole key (``_collect``), its arguments' entries and its cells';
//   donatable, input_buffers, write_back
//       the per-storage work around an execution (see their comment below);
//   set_data(var, new)
//       ``var.data = new`` across tpu, which PyTorch's set_data refuses (see below).
//
// Optional, like hooks.cpp: torchtpu/tensor/storage.py uses it when it was built and
// does the same in Python otherwise; tests/test_native_fast.py checks both agree.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_unsafe_view_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/squeeze_native.h>
#include <ATen/ops/swapaxes_native.h>
#include <ATen/ops/swapdims_native.h>
#include <ATen/ops/t_native.h>
#include <ATen/ops/transpose_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <vector>

namespace {

const c10::Device kDevice(c10::DeviceType::PrivateUse1, 0);
PyObject* kCell = nullptr;  // "_cell" and "nbytes", interned at import
PyObject* kNbytes = nullptr;
PyObject* kBuf = nullptr;  // Cell's "_buf", "lazy", "counted", "flush_for", "set", "shape" and "dtype"
PyObject* kShape = nullptr;
PyObject* kDtype = nullptr;
PyObject* kLiftedTag = nullptr;  // "s": the key entry of a number passed as an operand is ("s", type)
PyObject* kLazy = nullptr;
PyObject* kCounted = nullptr;
PyObject* kFlushFor = nullptr;
PyObject* kSet = nullptr;

// Opaque, non-null data pointers, spaced so that no two storages' byte ranges overlap
// (torch.save and PyTorch's overlap checks read them); never dereferenced.
std::atomic<uint64_t> next_pointer{1ULL << 32};

uint64_t take_pointer(int64_t nbytes) {
  uint64_t span = ((static_cast<uint64_t>(nbytes) + 4095) >> 12) + 1;
  return next_pointer.fetch_add(span << 12);
}

// A Python sequence of ints as a vector; false (with a Python error set) otherwise.
bool int_vector(PyObject* seq, std::vector<int64_t>& out) {
  PyObject* fast = PySequence_Fast(seq, "sizes and strides must be sequences of ints");
  if (!fast) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(n);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
  }
  Py_DECREF(fast);
  return true;
}

PyObject* fake_pointer(PyObject*, PyObject* nbytes) {
  int64_t n = PyLong_AsLongLong(nbytes);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  return PyLong_FromUnsignedLongLong(take_pointer(n));
}

PyObject* new_tensor(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "new_tensor(cell, sizes, strides, offset, dtype)");
    return nullptr;
  }
  PyObject* cell = args[0];
  PyObject* py_nbytes = PyObject_GetAttr(cell, kNbytes);
  if (!py_nbytes) return nullptr;
  int64_t nbytes = PyLong_AsLongLong(py_nbytes);
  Py_DECREF(py_nbytes);
  int64_t offset = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred()) return nullptr;
  if (!THPDtype_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "new_tensor: dtype must be a torch.dtype");
    return nullptr;
  }
  std::vector<int64_t> sizes, strides;
  if (!int_vector(args[1], sizes) || !int_vector(args[2], strides)) return nullptr;
  if (sizes.size() != strides.size()) {
    PyErr_SetString(PyExc_ValueError, "new_tensor: sizes and strides differ in length");
    return nullptr;
  }
  try {
    auto* ptr = reinterpret_cast<void*>(take_pointer(nbytes));
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(ptr, kDevice), nullptr, false);
    auto dtype = c10::scalarTypeToTypeMeta(reinterpret_cast<THPDtype*>(args[4])->scalar_type);
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    PyObject* py_storage = THPStorage_Wrap(t.storage());
    if (!py_storage) return nullptr;
    int failed = PyObject_SetAttr(py_storage, kCell, cell);
    Py_DECREF(py_storage);
    if (failed) return nullptr;
    return THPVariable_Wrap(std::move(t));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* int_tuple(c10::IntArrayRef values) {
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  if (!out) return nullptr;
  for (size_t i = 0; i < values.size(); ++i) {
    PyObject* v = PyLong_FromLongLong(values[i]);
    if (!v) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), v);
  }
  return out;
}

// ``t``'s storage cell (a new reference), or nullptr with a Python error (an
// AttributeError where its storage has none).
PyObject* storage_cell(const at::Tensor& t) {
  PyObject* py_storage = THPStorage_Wrap(t.storage());
  if (!py_storage) return nullptr;
  PyObject* cell = PyObject_GetAttr(py_storage, kCell);
  Py_DECREF(py_storage);
  return cell;
}

// The slot of tpu tensor ``t``'s storage cell in a call's ``cells``/``slot_of`` (keyed by
// id(cell), as the Python paths key it), given one on first sight. nullptr without a
// Python error: its storage has no cell (not made by torchtpu; Python explains).
PyObject* cell_slot(const at::Tensor& t, PyObject* cells, PyObject* slot_of) {
  PyObject* cell = storage_cell(t);
  if (!cell) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
    return nullptr;
  }
  PyObject* id = PyLong_FromVoidPtr(cell);
  PyObject* slot = id ? PyDict_GetItemWithError(slot_of, id) : nullptr;  // borrowed
  if (slot) {
    Py_INCREF(slot);
  } else if (id && !PyErr_Occurred()) {
    slot = PyLong_FromSsize_t(PyList_GET_SIZE(cells));
    if (slot && (PyDict_SetItem(slot_of, id, slot) || PyList_Append(cells, cell))) Py_CLEAR(slot);
  }
  Py_XDECREF(id);
  Py_DECREF(cell);
  return slot;
}

bool on_device(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.device().type() == c10::DeviceType::PrivateUse1;
}

PyObject* dtype_object(const at::Tensor& t) {
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
  Py_INCREF(dtype);
  return dtype;
}

// A compiled graph's key entry of a plain tpu tensor: (slot, dtype, sizes, strides,
// storage offset). nullptr without a Python error: not a plain tpu tensor (Python
// handles it: a stand-in for a CPU tensor, resolved conjugate and negative bits).
PyObject* graph_entry(PyObject* arg, PyObject* cells, PyObject* slot_of) {
  const at::Tensor& t = THPVariable_Unpack(arg);
  if (!on_device(t) || t.is_neg() || t.is_conj()) return nullptr;
  PyObject* slot = cell_slot(t, cells, slot_of);
  if (!slot) return nullptr;
  return Py_BuildValue("(NNNNn)", slot, dtype_object(t), int_tuple(t.sizes()), int_tuple(t.strides()),
                       static_cast<Py_ssize_t>(t.storage_offset()));
}

// A size-1 dimension's stride never addresses anything: the contiguous one in its place
// (torchtpu/eager/dispatch.py ``key_strides``).
PyObject* key_strides(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  std::vector<int64_t> out(strides.begin(), strides.end());
  int64_t acc = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    if (sizes[d] == 1) out[d] = acc;
    acc *= std::max<int64_t>(sizes[d], 1);
  }
  return int_tuple(out);
}

// An eager op's key entry of tpu tensor ``arg`` (torchtpu/eager/dispatch.py
// ``_Call.tensor``): (slot, dtype, sizes, key strides, offset, conj, neg), where a
// nonzero storage offset is ``runtime_offset`` and appended to ``offsets`` (the op takes
// it as an operand); ``arg`` appended to ``tensors``. nullptr without a Python error: its
// storage has no cell.
PyObject* eager_entry(PyObject* arg, PyObject* cells, PyObject* slot_of, PyObject* tensors, PyObject* runtime_offset,
                      PyObject* offsets) {
  const at::Tensor& t = THPVariable_Unpack(arg);
  if (!on_device(t)) return nullptr;
  PyObject* slot = cell_slot(t, cells, slot_of);
  if (!slot) return nullptr;
  if (PyList_Append(tensors, arg)) {
    Py_DECREF(slot);
    return nullptr;
  }
  int64_t offset = t.storage_offset();
  PyObject* py_offset;
  if (offset) {
    PyObject* n = PyLong_FromLongLong(offset);
    if (!n || PyList_Append(offsets, n)) {
      Py_XDECREF(n);
      Py_DECREF(slot);
      return nullptr;
    }
    Py_DECREF(n);
    Py_INCREF(runtime_offset);
    py_offset = runtime_offset;
  } else {
    py_offset = PyLong_FromLong(0);
  }
  return Py_BuildValue("(NNNNNNN)", slot, dtype_object(t), int_tuple(t.sizes()), key_strides(t.sizes(), t.strides()),
                       py_offset, PyBool_FromLong(t.is_conj()), PyBool_FromLong(t.is_neg()));
}

PyObject* graph_key(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) || !PyDict_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "graph_key(args: list, key: list, cells: list, slot_of: dict)");
    return nullptr;
  }
  PyObject *values = args[0], *key = args[1], *cells = args[2], *slot_of = args[3];
  try {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); ++i) {
      PyObject* a = PyList_GET_ITEM(values, i);
      PyObject* entry;
      if (THPVariable_Check(a)) {
        entry = graph_entry(a, cells, slot_of);
      } else if (PyLong_Check(a)) {  // a dynamic size (bool included): ("i", int(a))
        PyObject* n = PyNumber_Index(a);
        entry = n ? Py_BuildValue("(sN)", "i", n) : nullptr;
      } else if (a == Py_None) {
        Py_INCREF(Py_None);
        entry = Py_None;
      } else {
        Py_RETURN_FALSE;
      }
      if (!entry) {
        if (PyErr_Occurred()) return nullptr;
        Py_RETURN_FALSE;
      }
      int failed = PyList_Append(key, entry);
      Py_DECREF(entry);
      if (failed) return nullptr;
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_TRUE;
}

// Whether ``entry`` (a key's int tuple) holds exactly ``values``.
bool same_ints(PyObject* entry, c10::IntArrayRef values) {
  if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != static_cast<Py_ssize_t>(values.size())) return false;
  for (size_t i = 0; i < values.size(); ++i) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(entry, static_cast<Py_ssize_t>(i)), &overflow);
    if (overflow || v != values[i]) return false;
  }
  return true;
}

// Whether plain tpu tensor ``arg`` has the key entry ``entry`` (graph_entry's (slot, dtype,
// sizes, strides, offset)), its cell given its slot in ``cells``/``slot_of`` on the way;
// -1 on a Python error.
int same_graph_entry(PyObject* arg, PyObject* entry, PyObject* cells, PyObject* slot_of) {
  const at::Tensor& t = THPVariable_Unpack(arg);
  if (!on_device(t) || t.is_neg() || t.is_conj() || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 5) return 0;
  if (PyTuple_GET_ITEM(entry, 1) != reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()))) return 0;
  if (!same_ints(PyTuple_GET_ITEM(entry, 2), t.sizes()) || !same_ints(PyTuple_GET_ITEM(entry, 3), t.strides())) return 0;
  if (PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 4)) != t.storage_offset()) return PyErr_Occurred() ? -1 : 0;
  PyObject* slot = cell_slot(t, cells, slot_of);
  if (!slot) return PyErr_Occurred() ? -1 : 0;
  int same = PyObject_RichCompareBool(slot, PyTuple_GET_ITEM(entry, 0), Py_EQ);
  Py_DECREF(slot);
  return same;
}

// Cell.initialized: whether ``cell`` holds a buffer or a pending graph will write one (1 or
// 0); -1 on a Python error.
int cell_initialized(PyObject* cell) {
  PyObject* buf = PyObject_GetAttr(cell, kBuf);
  PyObject* lazy = buf ? PyObject_GetAttr(cell, kLazy) : nullptr;
  int initialized = lazy ? (buf != Py_None || lazy != Py_None) : -1;
  Py_XDECREF(buf);
  Py_XDECREF(lazy);
  return initialized;
}

// Whether the (buffer shape, dtype, initialized) of every cell in ``cells`` is ``entries``'s.
int same_cell_entries(PyObject* cells, PyObject* entries) {
  if (!PyTuple_Check(entries) || PyTuple_GET_SIZE(entries) != PyList_GET_SIZE(cells)) return 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(cells); ++i) {
    // cell_entry's (shape, dtype, initialized), compared field by field: no tuple built
    PyObject *want = PyTuple_GET_ITEM(entries, i), *cell = PyList_GET_ITEM(cells, i);
    if (!PyTuple_Check(want) || PyTuple_GET_SIZE(want) != 3) return 0;
    PyObject* dtype = PyObject_GetAttr(cell, kDtype);
    if (!dtype) return -1;
    Py_DECREF(dtype);  // a torch.dtype: a singleton, compared by identity as the tuple compares it first
    if (dtype != PyTuple_GET_ITEM(want, 1)) return 0;
    int initialized = cell_initialized(cell);
    if (initialized < 0) return -1;
    if (PyTuple_GET_ITEM(want, 2) != (initialized ? Py_True : Py_False)) return 0;
    PyObject* shape = PyObject_GetAttr(cell, kShape);
    if (!shape) return -1;
    int same = PyObject_RichCompareBool(shape, PyTuple_GET_ITEM(want, 0), Py_EQ);
    Py_DECREF(shape);
    if (same != 1) return same;
  }
  return 1;
}

// same_graph_key(args, key, cells, slot_of): whether a compiled graph's arguments ``args``
// have the cache key ``key`` (a whole earlier key: graph_key's entries, the cells' entries,
// the precision, which the caller compares) -- what graph_key and the cells' part would build,
// checked without building it. Fills ``cells``/``slot_of`` on the way; False (they may then
// hold part of the storages) for any difference, or an argument graph_key leaves to Python.
PyObject* same_graph_key(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyList_Check(args[0]) || !PyTuple_Check(args[1]) || !PyList_Check(args[2]) || !PyDict_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "same_graph_key(args: list, key: tuple, cells: list, slot_of: dict)");
    return nullptr;
  }
  PyObject *values = args[0], *key = args[1], *cells = args[2], *slot_of = args[3];
  Py_ssize_t n = PyList_GET_SIZE(values);
  if (PyTuple_GET_SIZE(key) != n + 2) Py_RETURN_FALSE;
  try {
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject *a = PyList_GET_ITEM(values, i), *entry = PyTuple_GET_ITEM(key, i);
      int same;
      if (THPVariable_Check(a)) {
        same = same_graph_entry(a, entry, cells, slot_of);
      } else if (PyLong_Check(a)) {  // ("i", int(a))
        same = PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2 ? PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 1), a, Py_EQ) : 0;
        if (same == 1 && !PyUnicode_Check(PyTuple_GET_ITEM(entry, 0))) same = 0;
      } else {
        same = a == Py_None && entry == Py_None;
      }
      if (same < 0) return nullptr;
      if (!same) Py_RETURN_FALSE;
    }
    int same = same_cell_entries(cells, PyTuple_GET_ITEM(key, n));
    if (same < 0) return nullptr;
    return PyBool_FromLong(same);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// The key entries of an eager op's tensor arguments ``items`` (a list or tuple; None items
// stay None) as a new tuple. nullptr without a Python error where one is not a tpu tensor
// (checked for every item before any state changes: a CPU scalar the op moves, or one it
// refuses, is Python's) or has no storage cell; nullptr with one on failure.
PyObject* tensor_entries(PyObject* items, PyObject* cells, PyObject* slot_of, PyObject* tensors, PyObject* runtime_offset,
                         PyObject* offsets) {
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PySequence_Fast_GET_ITEM(items, i);
    if (a != Py_None && !(THPVariable_Check(a) && on_device(THPVariable_Unpack(a)))) return nullptr;
  }
  PyObject* out = PyTuple_New(n);
  try {
    for (Py_ssize_t i = 0; out && i < n; ++i) {
      PyObject* a = PySequence_Fast_GET_ITEM(items, i);
      PyObject* entry = a == Py_None ? Py_NewRef(a) : eager_entry(a, cells, slot_of, tensors, runtime_offset, offsets);
      if (!entry) Py_CLEAR(out);
      else PyTuple_SET_ITEM(out, i, entry);
    }
  } catch (const std::exception& e) {
    Py_CLEAR(out);
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return out;
}

// eager_keys(tensors, cells, slot_of, seen, runtime_offset, offsets): tensor_entries of an
// eager op's tensor arguments ``tensors`` (a sequence), or None where Python must key them.
PyObject* eager_keys(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyList_Check(args[1]) || !PyDict_Check(args[2]) || !PyList_Check(args[3]) || !PyList_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError, "eager_keys(tensors, cells: list, slot_of: dict, seen: list, runtime_offset, offsets: list)");
    return nullptr;
  }
  PyObject* items = PySequence_Fast(args[0], "eager_keys: tensors must be a sequence");
  if (!items) return nullptr;
  PyObject* out = tensor_entries(items, args[1], args[2], args[3], args[4], args[5]);
  Py_DECREF(items);
  if (!out && !PyErr_Occurred()) Py_RETURN_NONE;
  return out;
}

// collect_call(kinds, values, lift, key, cells, slot_of, tensors, scalars, scalar_types):
// the whole of an eager op's cache key but its precision (torchtpu/eager/dispatch.py
// ``_collect``, whose Python loop stays the twin): per argument its entry appended to
// ``key``, then one (buffer shape, dtype, initialized) entry per storage cell. Python
// numbers passed as device operands and nonzero view offsets go to ``scalars`` and
// ``scalar_types`` in argument order through the Python helpers ``configure_collect``
// gave. False where an argument needs Python (a CPU tensor, a number where the schema
// says Tensor, a Scalar[] operand, a tensor where none belongs); the lists may then hold
// a partial key, which the caller drops.
struct CollectHelpers {
  PyObject* runtime_offset = nullptr;  // the scalar_types entry of a view's offset
  PyObject* device_scalar = nullptr;   // device_scalar(value, pytype) -> buffer
  PyObject* freeze = nullptr;          // _freeze(value) for what C leaves to Python
};
CollectHelpers helpers;
enum Kind { kTensor = 0, kTensorList = 1, kScalar = 2, kScalarList = 3 };

PyObject* configure_collect(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "configure_collect(runtime_offset, device_scalar, freeze)");
    return nullptr;
  }
  for (int i = 0; i < 3; ++i) Py_INCREF(args[i]);
  Py_XSETREF(helpers.runtime_offset, args[0]);
  Py_XSETREF(helpers.device_scalar, args[1]);
  Py_XSETREF(helpers.freeze, args[2]);
  Py_RETURN_NONE;
}

// Append ``item`` to ``list`` and drop the reference; false on failure (or a null item).
bool append_new(PyObject* list, PyObject* item) {
  if (!item) return false;
  int failed = PyList_Append(list, item);
  Py_DECREF(item);
  return !failed;
}

// dispatch._freeze for the common static arguments: exact ints and bools as (type, v),
// None as itself, plain floats as (float, v), lists of those as tuples; the rest through
// the Python helper (nan, -0.0, generators, dtypes, strings...).
PyObject* freeze(PyObject* v) {
  PyTypeObject* tp = Py_TYPE(v);
  if (tp == &PyLong_Type || tp == &PyBool_Type) return PyTuple_Pack(2, reinterpret_cast<PyObject*>(tp), v);
  if (v == Py_None) {
    Py_INCREF(v);
    return v;
  }
  if (tp == &PyFloat_Type) {
    double d = PyFloat_AS_DOUBLE(v);
    if (d == d && !(d == 0.0 && std::signbit(d))) return PyTuple_Pack(2, reinterpret_cast<PyObject*>(tp), v);
  } else if (tp == &PyList_Type) {
    Py_ssize_t n = PyList_GET_SIZE(v);
    PyObject* out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out && i < n; ++i) {
      PyObject* item = PyList_GET_ITEM(v, i);
      if (THPVariable_Check(item)) {  // Python raises its error
        Py_DECREF(out);
        return PyObject_CallOneArg(helpers.freeze, v);
      }
      PyObject* f = freeze(item);
      if (!f) Py_CLEAR(out);
      else PyTuple_SET_ITEM(out, i, f);
    }
    return out;
  }
  return PyObject_CallOneArg(helpers.freeze, v);
}

// oplower.lifted: a bool always; an int, float or complex unless it is 0, 1 or -1.
bool lifted(PyObject* v, bool lift) {
  if (!lift) return false;
  PyTypeObject* tp = Py_TYPE(v);
  if (tp == &PyBool_Type) return true;
  if (tp == &PyLong_Type) {
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    return overflow || (n != 0 && n != 1 && n != -1);
  }
  if (tp == &PyFloat_Type) {
    double d = PyFloat_AS_DOUBLE(v);
    return !(d == 0.0 || d == 1.0 || d == -1.0);  // nan compares unequal: lifted, as in Python
  }
  if (tp == &PyComplex_Type) {
    Py_complex c = PyComplex_AsCComplex(v);
    return !(c.imag == 0.0 && (c.real == 0.0 || c.real == 1.0 || c.real == -1.0));
  }
  return false;
}

// A scalar argument's key entry: ("s", type) with its device buffer appended to
// ``scalars``, or its frozen value.
PyObject* scalar_entry(PyObject* v, bool lift, PyObject* scalars, PyObject* scalar_types) {
  if (!lifted(v, lift)) return freeze(v);
  PyObject* tp = reinterpret_cast<PyObject*>(Py_TYPE(v));
  PyObject* buf = PyObject_CallFunctionObjArgs(helpers.device_scalar, v, tp, nullptr);
  if (!append_new(scalars, buf) || PyList_Append(scalar_types, tp)) return nullptr;
  return PyTuple_Pack(2, kLiftedTag, tp);
}

// The device scalars of the nonzero view offsets eager_entry collected, in order.
bool offset_scalars(PyObject* offsets, PyObject* scalars, PyObject* scalar_types) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(offsets); ++i) {
    PyObject* buf = PyObject_CallFunctionObjArgs(helpers.device_scalar, PyList_GET_ITEM(offsets, i),
                                                 reinterpret_cast<PyObject*>(&PyLong_Type), nullptr);
    if (!append_new(scalars, buf) || PyList_Append(scalar_types, helpers.runtime_offset)) return false;
  }
  return PyList_SetSlice(offsets, 0, PyList_GET_SIZE(offsets), nullptr) == 0;
}

bool holds_a_tensor(PyObject* v) {
  if (THPVariable_Check(v)) return true;
  if (!PyList_Check(v) && !PyTuple_Check(v)) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v); ++i)
    if (THPVariable_Check(PySequence_Fast_GET_ITEM(v, i))) return true;
  return false;
}

// The (buffer shape, dtype, initialized) entry of a storage cell.
PyObject* cell_entry(PyObject* cell) {
  PyObject* shape = PyObject_GetAttr(cell, kShape);
  PyObject* dtype = shape ? PyObject_GetAttr(cell, kDtype) : nullptr;
  int initialized = dtype ? cell_initialized(cell) : -1;
  if (initialized < 0) {
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    return nullptr;
  }
  return Py_BuildValue("(NNO)", shape, dtype, initialized ? Py_True : Py_False);
}

// One argument's key entry; nullptr without a Python error where Python must collect.
PyObject* argument_entry(long kind, PyObject* v, bool lift, PyObject* const* lists, PyObject* offsets) {
  PyObject *cells = lists[1], *slot_of = lists[2], *tensors = lists[3], *scalars = lists[4], *scalar_types = lists[5];
  if (kind == kTensor) {
    if (v == Py_None) {
      Py_INCREF(v);
      return v;
    }
    if (!THPVariable_Check(v) || !on_device(THPVariable_Unpack(v))) return nullptr;
    PyObject* entry = eager_entry(v, cells, slot_of, tensors, helpers.runtime_offset, offsets);
    if (entry && !offset_scalars(offsets, scalars, scalar_types)) Py_CLEAR(entry);
    return entry;
  }
  if (kind == kTensorList) {
    if (!PyList_Check(v) && !PyTuple_Check(v)) return nullptr;
    PyObject* out = tensor_entries(v, cells, slot_of, tensors, helpers.runtime_offset, offsets);
    if (out && !offset_scalars(offsets, scalars, scalar_types)) Py_CLEAR(out);
    return out;
  }
  if (kind == kScalar) return scalar_entry(v, lift, scalars, scalar_types);
  if (kind == kScalarList && lift && PyObject_IsTrue(v) == 1) return nullptr;  // uploaded by numpy, in Python
  if (holds_a_tensor(v)) return nullptr;  // Python raises
  return freeze(v);
}

PyObject* collect_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 9 || !(PyTuple_Check(args[0]) || PyList_Check(args[0])) || !PyList_Check(args[1]) || !PyList_Check(args[3]) || !PyList_Check(args[4]) ||
      !PyDict_Check(args[5]) || !PyList_Check(args[6]) || !PyList_Check(args[7]) || !PyList_Check(args[8])) {
    PyErr_SetString(PyExc_TypeError,
                    "collect_call(kinds: list, values: list, lift, key: list, cells: list, slot_of: dict, tensors: list, "
                    "scalars: list, scalar_types: list)");
    return nullptr;
  }
  if (!helpers.device_scalar) {
    PyErr_SetString(PyExc_RuntimeError, "collect_call: configure_collect was not called");
    return nullptr;
  }
  PyObject *kinds = args[0], *values = args[1], *key = args[3], *cells = args[4];
  PyObject* const* lists = args + 3;  // key, cells, slot_of, tensors, scalars, scalar_types
  bool lift = PyObject_IsTrue(args[2]) == 1;
  Py_ssize_t n = std::min(PySequence_Fast_GET_SIZE(kinds), PyList_GET_SIZE(values));
  PyObject* offsets = PyList_New(0);
  if (!offsets) return nullptr;
  try {
    for (Py_ssize_t i = 0; i < n; ++i) {
      long kind = PyLong_AsLong(PySequence_Fast_GET_ITEM(kinds, i));
      PyObject* entry = argument_entry(kind, PyList_GET_ITEM(values, i), lift, lists, offsets);
      if (!entry) {
        Py_DECREF(offsets);
        if (PyErr_Occurred()) return nullptr;
        Py_RETURN_FALSE;
      }
      if (!append_new(key, entry)) {
        Py_DECREF(offsets);
        return nullptr;
      }
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(cells); ++i) {
      if (!append_new(key, cell_entry(PyList_GET_ITEM(cells, i)))) {
        Py_DECREF(offsets);
        return nullptr;
      }
    }
  } catch (const std::exception& e) {
    Py_DECREF(offsets);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_DECREF(offsets);
  Py_RETURN_TRUE;
}

// The per-storage work around a program's execution, where an optimizer's foreach op
// touches ~100 storages (torchtpu/eager/dispatch.py ``_donatable``, the runners' input
// lists, torchtpu/runner/program.py ``write_back``; their Python twins stay):
//
//   donatable(tensors, slot_of)  the call slots of ``tensors`` (an in-place op's rewritten
//       ones) whose buffer only its storage cell holds and that no pending graph produces;
//   input_buffers(cells)  each cell's buffer, a pending one's graph run first
//       (``cell.lazy.flush_for(cell)``), cells never written left out;
//   write_back(updates, cells, outs, n)  ``cells[updates[i]]`` takes ``outs[n + i]``, through
//       ``Cell.set`` where the cell is pending or not yet counted.
// set_data(var, new): ``var.data = new`` for a pair PyTorch's set_data refuses only because
// a dense CPU tensor and a PrivateUse1 one are not "compatible shallow-copy types" (the
// check lists CPU, CUDA, MPS, XPU, HPU and MTIA). Both are plain TensorImpls, so the same
// steps as VariableHooks::set_data apply: a gradient accumulator made for another device
// or type is dropped, and var's TensorImpl takes new's storage, sizes, strides, dtype,
// device and dispatch keys. var keeps its Python object, weak references, hooks and
// autograd metadata, as ``param.data = param.cuda()`` keeps them (torchtpu/device/modules.py).
PyObject* set_data(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2 || !THPVariable_Check(args[0]) || !THPVariable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "set_data(var, new) takes two tensors");
    return nullptr;
  }
  const at::Tensor& self = THPVariable_Unpack(args[0]);
  const at::Tensor& data = THPVariable_Unpack(args[1]);
  if (auto* meta = torch::autograd::impl::get_autograd_meta(self)) {
    std::lock_guard<std::mutex> lock(meta->mutex_);
    auto accumulator = meta->grad_accumulator_.lock();
    if (accumulator &&
        (!data.options().type_equal(self.options()) || accumulator->input_metadata(0).device() != data.device())) {
      meta->grad_accumulator_.reset();
    }
  }
  self.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* donatable(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "donatable(tensors: list, slot_of: dict)");
    return nullptr;
  }
  PyObject* slots = PyList_New(0);
  try {
    for (Py_ssize_t i = 0; slots && i < PyList_GET_SIZE(args[0]); ++i) {
      PyObject* t = PyList_GET_ITEM(args[0], i);
      if (!THPVariable_Check(t)) continue;
      PyObject* cell = storage_cell(THPVariable_Unpack(t));
      PyObject* buf = cell ? PyObject_GetAttr(cell, kBuf) : nullptr;
      PyObject* lazy = buf ? PyObject_GetAttr(cell, kLazy) : nullptr;
      bool ok = lazy != nullptr;
      // references to the buffer: the cell's and ours; any other holder (a storage sharing
      // it, a pending graph reading it) forbids donation
      if (ok && buf != Py_None && lazy == Py_None && Py_REFCNT(buf) == 2) {
        PyObject* id = PyLong_FromVoidPtr(cell);
        PyObject* slot = id ? PyDict_GetItemWithError(args[1], id) : nullptr;  // borrowed
        Py_XDECREF(id);
        if (!slot) {
          if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "donatable: a tensor's storage is not in the call");
          ok = false;
        } else {
          ok = PyList_Append(slots, slot) == 0;
        }
      }
      Py_XDECREF(lazy);
      Py_XDECREF(buf);
      Py_XDECREF(cell);
      if (!ok) Py_CLEAR(slots);
    }
  } catch (const std::exception& e) {
    Py_CLEAR(slots);
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  if (!slots) return nullptr;
  PyObject* out = PyList_AsTuple(slots);
  Py_DECREF(slots);
  return out;
}

PyObject* input_buffers(PyObject*, PyObject* cells) {
  PyObject* items = PySequence_Fast(cells, "input_buffers: cells must be a sequence");
  if (!items) return nullptr;
  PyObject* out = PyList_New(0);
  for (Py_ssize_t i = 0; out && i < PySequence_Fast_GET_SIZE(items); ++i) {
    PyObject* cell = PySequence_Fast_GET_ITEM(items, i);
    PyObject* lazy = PyObject_GetAttr(cell, kLazy);
    bool ok = lazy != nullptr, pending = ok && lazy != Py_None;
    if (pending) {  // a pending graph produces it: run that first
      PyObject* r = PyObject_CallMethodOneArg(lazy, kFlushFor, cell);
      ok = r != nullptr;
      Py_XDECREF(r);
    }
    Py_XDECREF(lazy);
    PyObject* buf = ok ? PyObject_GetAttr(cell, kBuf) : nullptr;
    // a pending cell is an input whatever its graph left (as Cell.initialized decides
    // before Cell.buf runs the graph): a missing buffer then fails the call loudly
    // instead of shifting the inputs after it
    if (!buf || ((pending || buf != Py_None) && PyList_Append(out, buf))) Py_CLEAR(out);
    Py_XDECREF(buf);
  }
  Py_DECREF(items);
  return out;
}

PyObject* write_back(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "write_back(updates, cells, outs, n: int)");
    return nullptr;
  }
  PyObject* updates = PySequence_Fast(args[0], "write_back: updates must be a sequence");
  if (!updates) return nullptr;
  PyObject* outs = PySequence_Fast(args[2], "write_back: outs must be a sequence");
  if (!outs) {
    Py_DECREF(updates);
    return nullptr;
  }
  Py_ssize_t n = PyLong_AsSsize_t(args[3]);
  bool ok = !(n == -1 && PyErr_Occurred());
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(updates) && n + i < PySequence_Fast_GET_SIZE(outs); ++i) {
    PyObject* cell = PyObject_GetItem(args[1], PySequence_Fast_GET_ITEM(updates, i));
    PyObject* buf = PySequence_Fast_GET_ITEM(outs, n + i);
    PyObject* lazy = cell ? PyObject_GetAttr(cell, kLazy) : nullptr;
    PyObject* counted = lazy ? PyObject_GetAttr(cell, kCounted) : nullptr;
    if (!counted) {
      ok = false;
    } else if (lazy == Py_None && counted == Py_True) {
      ok = PyObject_SetAttr(cell, kBuf, buf) == 0;
    } else {  // Cell.set runs the pending graph and counts the bytes
      PyObject* r = PyObject_CallMethodOneArg(cell, kSet, buf);
      ok = r != nullptr;
      Py_XDECREF(r);
    }
    Py_XDECREF(counted);
    Py_XDECREF(lazy);
    Py_XDECREF(cell);
  }
  Py_DECREF(updates);
  Py_DECREF(outs);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// View ops only change metadata: the tpu kernels of the ops whose kernels are per backend
// are the ones PyTorch's Meta key runs (torchtpu/eager/minimal.py ``VIEW_OPS`` does the
// same from Python by redispatching to Meta, about 1.5 us per view). Registered once;
// returns the ops' names, which torchtpu then leaves out of its Python registrations.
PyObject* register_view_kernels(PyObject*, PyObject*) {
  static torch::Library* lib = nullptr;
  static const char* names[] = {
      "view",       "view.dtype", "_unsafe_view", "_reshape_alias", "as_strided", "unfold",     "view_as_real",
      "view_as_complex", "squeeze_", "squeeze_.dim", "squeeze_.dims", "unsqueeze_", "transpose_", "t_",
      "swapdims_",  "swapaxes_",  "as_strided_"};
  try {
    if (!lib) {
      auto* l = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
      l->impl("view", TORCH_FN(at::native::view));
      l->impl("view.dtype", TORCH_FN(at::native::view_dtype));
      l->impl("_unsafe_view", TORCH_FN(at::native::_unsafe_view));
      l->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
      l->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl_meta_symint));
      l->impl("unfold", TORCH_FN(at::native::unfold));
      l->impl("view_as_real", TORCH_FN(at::native::view_as_real));
      l->impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
      l->impl("squeeze_", static_cast<at::Tensor& (*)(at::Tensor&)>(at::native::squeeze_));
      l->impl("squeeze_.dim", static_cast<at::Tensor& (*)(at::Tensor&, int64_t)>(at::native::squeeze_));
      l->impl("squeeze_.dims", static_cast<at::Tensor& (*)(at::Tensor&, at::IntArrayRef)>(at::native::squeeze_));
      l->impl("unsqueeze_", TORCH_FN(at::native::unsqueeze_));
      l->impl("transpose_", TORCH_FN(at::native::transpose_));
      l->impl("t_", TORCH_FN(at::native::t_));
      l->impl("swapdims_", TORCH_FN(at::native::swapdims_));
      l->impl("swapaxes_", TORCH_FN(at::native::swapaxes_));
      l->impl("as_strided_", TORCH_FN(at::native::as_strided__symint));
      lib = l;
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  PyObject* out = PyList_New(0);
  for (const char* n : names) {
    PyObject* name = out ? PyUnicode_FromString(n) : nullptr;
    if (!name || PyList_Append(out, name)) {
      Py_XDECREF(name);
      Py_CLEAR(out);
      break;
    }
    Py_DECREF(name);
  }
  return out;
}

PyMethodDef methods[] = {
    {"fake_pointer", fake_pointer, METH_O, "The next opaque data pointer for a storage of nbytes bytes."},
    {"new_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(new_tensor)), METH_FASTCALL,
     "new_tensor(cell, sizes, strides, offset, dtype): a tpu tensor over a new storage of cell.nbytes bytes carrying cell."},
    {"graph_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(graph_key)), METH_FASTCALL,
     "graph_key(args, key, cells, slot_of): append the key entries of a compiled graph's arguments; "
     "False when one is not a plain tpu tensor, an int or None."},
    {"same_graph_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(same_graph_key)), METH_FASTCALL,
     "same_graph_key(args, key, cells, slot_of): whether a compiled graph's arguments have the cache key key "
     "(but its precision), found without building it."},
    {"eager_keys", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(eager_keys)), METH_FASTCALL,
     "eager_keys(tensors, cells, slot_of, seen, runtime_offset, offsets): an eager op's key entries of tensors "
     "(a tuple), or None where one needs Python."},
    {"collect_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(collect_call)), METH_FASTCALL,
     "collect_call(kinds, values, lift, key, cells, slot_of, tensors, scalars, scalar_types): an eager op's key "
     "but its precision; False where an argument needs Python."},
    {"configure_collect", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(configure_collect)), METH_FASTCALL,
     "configure_collect(runtime_offset, device_scalar, freeze): the Python helpers of collect_call."},
    {"donatable", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(donatable)), METH_FASTCALL,
     "donatable(tensors, slot_of): the call slots of tensors whose buffer only their storage cell holds."},
    {"set_data", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_data)), METH_FASTCALL,
     "set_data(var, new): var.data = new across tpu, keeping var's object and autograd metadata as CUDA's set_data does."},
    {"input_buffers", input_buffers, METH_O, "input_buffers(cells): each written cell's buffer, pending graphs run first."},
    {"write_back", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(write_back)), METH_FASTCALL,
     "write_back(updates, cells, outs, n): cells[updates[i]] takes outs[n + i]."},
    {"register_view_kernels", register_view_kernels, METH_NOARGS,
     "Register the tpu kernels of the per-backend view ops (once); their qualified overload names."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchtpu.tensor._fast", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__fast() {
  kCell = PyUnicode_InternFromString("_cell");
  kNbytes = PyUnicode_InternFromString("nbytes");
  kBuf = PyUnicode_InternFromString("_buf");
  kLazy = PyUnicode_InternFromString("lazy");
  kCounted = PyUnicode_InternFromString("counted");
  kFlushFor = PyUnicode_InternFromString("flush_for");
  kSet = PyUnicode_InternFromString("set");
  kShape = PyUnicode_InternFromString("shape");
  kDtype = PyUnicode_InternFromString("dtype");
  kLiftedTag = PyUnicode_InternFromString("s");
  if (!kCell || !kNbytes || !kBuf || !kLazy || !kCounted || !kFlushFor || !kSet || !kShape || !kDtype || !kLiftedTag) return nullptr;
  return PyModule_Create(&module);
}
