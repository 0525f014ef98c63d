// C++ versions of the two things every op and every compiled-graph call does per tensor,
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
//   eager_keys(tensors, cells, slot_of, seen, runtime_offset, offsets)
//       the same for an eager op's tensor arguments (torchtpu/eager/dispatch.py
//       ``_Call.tensor``), whose entries also normalize size-1 strides and make a nonzero
//       storage offset a runtime operand.
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
#include <torch/csrc/autograd/python_variable.h>
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
#include <atomic>
#include <vector>

namespace {

const c10::Device kDevice(c10::DeviceType::PrivateUse1, 0);
PyObject* kCell = nullptr;  // "_cell" and "nbytes", interned at import
PyObject* kNbytes = nullptr;

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

// The slot of tpu tensor ``t``'s storage cell in a call's ``cells``/``slot_of`` (keyed by
// id(cell), as the Python paths key it), given one on first sight. nullptr without a
// Python error: its storage has no cell (not made by torchtpu; Python explains).
PyObject* cell_slot(const at::Tensor& t, PyObject* cells, PyObject* slot_of) {
  PyObject* py_storage = THPStorage_Wrap(t.storage());
  if (!py_storage) return nullptr;
  PyObject* cell = PyObject_GetAttr(py_storage, kCell);
  Py_DECREF(py_storage);
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

// eager_keys(tensors, cells, slot_of, seen, runtime_offset, offsets): the key entries of
// an eager op's tensor arguments ``tensors`` (a list; None items stay None) as a tuple,
// or None, having changed nothing, where one is not a tpu tensor.
PyObject* eager_keys(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyList_Check(args[1]) || !PyDict_Check(args[2]) || !PyList_Check(args[3]) || !PyList_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError, "eager_keys(tensors, cells: list, slot_of: dict, seen: list, runtime_offset, offsets: list)");
    return nullptr;
  }
  PyObject* items = PySequence_Fast(args[0], "eager_keys: tensors must be a sequence");
  if (!items) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  // first every item's kind, before any state changes: a tensor on another device (a CPU
  // scalar the op moves, or one it refuses) is Python's
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PySequence_Fast_GET_ITEM(items, i);
    if (a != Py_None && !(THPVariable_Check(a) && on_device(THPVariable_Unpack(a)))) {
      Py_DECREF(items);
      Py_RETURN_NONE;
    }
  }
  PyObject* out = PyTuple_New(n);
  try {
    for (Py_ssize_t i = 0; out && i < n; ++i) {
      PyObject* a = PySequence_Fast_GET_ITEM(items, i);
      PyObject* entry;
      if (a == Py_None) {
        Py_INCREF(Py_None);
        entry = Py_None;
      } else if (THPVariable_Check(a)) {
        entry = eager_entry(a, args[1], args[2], args[3], args[4], args[5]);
      } else {
        entry = nullptr;
      }
      if (!entry) {
        Py_CLEAR(out);
        if (!PyErr_Occurred()) {
          Py_DECREF(items);
          Py_RETURN_NONE;
        }
        break;
      }
      PyTuple_SET_ITEM(out, i, entry);
    }
  } catch (const std::exception& e) {
    Py_CLEAR(out);
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  Py_DECREF(items);
  return out;
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
    {"eager_keys", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(eager_keys)), METH_FASTCALL,
     "eager_keys(tensors, cells, slot_of, seen, runtime_offset, offsets): an eager op's key entries of tensors "
     "(a tuple), or None where one needs Python."},
    {"register_view_kernels", register_view_kernels, METH_NOARGS,
     "Register the tpu kernels of the per-backend view ops (once); their qualified overload names."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchtpu.tensor._fast", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__fast() {
  kCell = PyUnicode_InternFromString("_cell");
  kNbytes = PyUnicode_InternFromString("nbytes");
  if (!kCell || !kNbytes) return nullptr;
  return PyModule_Create(&module);
}
