// The live device bytes of torch.tpu.memory_allocated, counted in C: every storage cell
// counts its buffer when it gets one and uncounts it when it dies (torchtpu/tensor/
// storage.py), which is twice per op result. The Python twin in torchtpu/runtime/memory.py
// takes a lock around a dict update (0.7 us per cell's life, a tenth of a small op's
// dispatch); these functions run under the GIL, which is all the exclusion they need
// (nothing here releases it).
//
// Optional, like the other extensions: torchtpu/runtime/memory.py uses it when it was
// built and counts in Python otherwise; tests/test_native_fast.py checks both agree.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static long long allocated_bytes = 0;
static long long peak_bytes = 0;
static long long num_allocs = 0;
static long long num_frees = 0;
static long long num_live = 0;  // num_allocs - num_frees until reset_accumulated zeroes both

static PyObject* allocated(PyObject* self, PyObject* nbytes) {
  long long n = PyLong_AsLongLong(nbytes);
  if (n == -1 && PyErr_Occurred()) return NULL;
  allocated_bytes += n;
  num_allocs += 1;
  num_live += 1;
  if (allocated_bytes > peak_bytes) peak_bytes = allocated_bytes;
  Py_RETURN_NONE;
}

static PyObject* freed(PyObject* self, PyObject* nbytes) {
  long long n = PyLong_AsLongLong(nbytes);
  if (n == -1 && PyErr_Occurred()) return NULL;
  allocated_bytes -= n;
  num_frees += 1;
  num_live -= 1;
  Py_RETURN_NONE;
}

static PyObject* current(PyObject* self, PyObject* unused) { return PyLong_FromLongLong(allocated_bytes); }

static PyObject* peak(PyObject* self, PyObject* unused) { return PyLong_FromLongLong(peak_bytes); }

static PyObject* reset_peak(PyObject* self, PyObject* unused) {
  peak_bytes = allocated_bytes;
  Py_RETURN_NONE;
}

static PyObject* reset_accumulated(PyObject* self, PyObject* unused) {
  num_allocs = 0;
  num_frees = 0;
  Py_RETURN_NONE;
}
static PyObject* snapshot(PyObject* self, PyObject* unused) {
  return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L}", "allocated_bytes", allocated_bytes, "peak_bytes", peak_bytes,
                       "num_allocs", num_allocs, "num_frees", num_frees, "num_live", num_live);
}

static PyMethodDef methods[] = {
    {"allocated", allocated, METH_O, "allocated(nbytes): a buffer of nbytes is now held."},
    {"freed", freed, METH_O, "freed(nbytes): a buffer of nbytes was released."},
    {"current", current, METH_NOARGS, "The bytes held now."},
    {"peak", peak, METH_NOARGS, "The most bytes held since the last reset_peak()."},
    {"reset_peak", reset_peak, METH_NOARGS, "Start the peak from the bytes held now."},
    {"reset_accumulated", reset_accumulated, METH_NOARGS, "Zero the counts of allocations and frees so far."},
    {"snapshot", snapshot, METH_NOARGS, "All counters as a dict."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchtpu.runtime._counters", NULL, -1, methods};

PyMODINIT_FUNC PyInit__counters(void) { return PyModule_Create(&module); }
