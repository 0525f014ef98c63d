// The tpu device's C++ hooks: what PyTorch asks a backend's PrivateUse1HooksInterface for
// and a Python hooks object cannot give -- a generator per `torch.Generator("tpu")` and a
// pinned host allocator (`pin_memory=True`, `Tensor.pin_memory()`, `is_pinned()`) -- its
// entry in the allocator registry, which `torch.accelerator`'s memory functions read, and
// its device guard, which the Python one (torch._C._acc.DeviceGuard) answers by calling into
// Python for the device type on every use: the autograd engine and the dispatcher ask it
// about 150 times per minGPT training step.
//
// Optional: torchtpu imports it when it was built (setup.py builds it when torch and a C++
// compiler are there) and registers Python hooks otherwise, which lack these two things.
// No pybind11: a one-function CPython module keeps the build to the ATen headers.

#include <Python.h>

#include <cstdlib>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstring>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <mutex>
#include <unordered_set>

namespace {

constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // PyTorch's default seed
constexpr size_t kStateBytes = 2 * sizeof(uint64_t);  // [seed, offset], torch.tpu.get_rng_state's layout

// A tpu generator is the device RNG's state on its own: a Philox key (the seed) and a
// counter (the offset). A random op given the generator draws with [seed, offset] and
// moves the offset on by one, as the device's default state does (torchtpu/eager/rng.py),
// so a generator seeded with s gives what torch.tpu.manual_seed(s) gives.
struct TpuGenerator final : public c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl{
            c10::Device(c10::DeviceType::PrivateUse1, index),
            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)} {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, c10::ScalarType::Byte, std::nullopt,
                                       std::nullopt, std::nullopt, std::nullopt);
    uint64_t words[2] = {seed_, offset_};
    std::memcpy(state.data_ptr(), words, kStateBytes);
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == static_cast<int64_t>(kStateBytes),
                "RNG state must be a torch.ByteTensor of ", kStateBytes,
                " bytes (what Generator.get_state() returns for a tpu generator), got ", state.numel(), " elements of ",
                state.dtype().name());
    TORCH_CHECK(state.is_contiguous(), "RNG state must be contiguous");
    uint64_t words[2];
    std::memcpy(words, state.data(), kStateBytes);
    seed_ = words[0];
    offset_ = words[1];
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }

  uint64_t seed_ = kDefaultSeed;
  uint64_t offset_ = 0;
};

// Pinned host memory for the tpu device. The PjRT client copies from any host address
// (there is no page-locking to do on the cpu platform), so a pinned block is an ordinary
// aligned CPU allocation that remembers it was asked for pinned: `is_pinned()` is true
// for exactly the storages this allocator made, as on CUDA.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (data) {
      std::lock_guard<std::mutex> lock(mutex());
      blocks().insert(data);
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static bool pinned(const void* data) {
    std::lock_guard<std::mutex> lock(mutex());
    return blocks().count(const_cast<void*>(data)) > 0;
  }

 private:
  static void release(void* data) {
    if (!data) return;
    {
      std::lock_guard<std::mutex> lock(mutex());
      blocks().erase(data);
    }
    c10::free_cpu(data);
  }
  // function-local statics: alive for deleters that run at interpreter exit
  static std::mutex& mutex() {
    static auto* m = new std::mutex();
    return *m;
  }
  static std::unordered_set<void*>& blocks() {
    static auto* s = new std::unordered_set<void*>();
    return *s;
  }
};

// A device index other than tpu:0 (or none): refused, as CUDA refuses an ordinal it has not
// ("invalid device ordinal") instead of running on another device; what to do, as in
// torchtpu.errors.one_device_error.
// tpu:LOCAL_RANK names the same device in a process torchrun started (torchtpu.errors.
// names_this_process_device): the CUDA recipe's set_device(local_rank) runs unchanged.
void check_index(c10::DeviceIndex index) {
  if (index <= 0) return;
  const char* local_rank = std::getenv("LOCAL_RANK");
  if (local_rank != nullptr && *local_rank != '\0' && index == std::atoi(local_rank)) return;
  TORCH_CHECK(false, "Invalid device index ", static_cast<int>(index),
              ": each torchtpu process drives exactly one device, tpu:0 (also named tpu:LOCAL_RANK in a process "
              "torchrun started). To use several devices, run one process per device (torchrun "
              "--nproc-per-node=N) and use 'tpu' (or 'tpu:0', or 'tpu:LOCAL_RANK') in each.");
}

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return 1; }  // one device per process (torch.tpu.device_count)
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex device) const override { check_index(device); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    check_index(device);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    check_index(index);
    return at::make_generator<TpuGenerator>(0);  // tpu:LOCAL_RANK is tpu:0 too
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    TORCH_CHECK(false,
                "the tpu device's default random state is torch.tpu's: seed it with torch.manual_seed or "
                "torch.tpu.manual_seed, save and restore it with torch.tpu.get_rng_state / set_rng_state, or "
                "make a generator of your own with torch.Generator(device='tpu')");
  }

  // `untyped_storage().resize_(n)` (FSDP's FullyShardedDataParallel frees and restores its
  // unsharded parameters so): the storage's device buffer (its cell, an attribute of its
  // Python object) is resized in Python, `torch.tpu._resize_storage`, which returns the
  // data pointer of the storage's new byte range; the StorageImpl then holds it and the size.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;

  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    static PinnedAllocator allocator;
    return &allocator;
  }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(c10::DeviceType::PrivateUse1, 0); }

};

// The device guard of one device with one in-order queue: what torch._C._acc.DeviceGuard
// does, without the call into Python (device tpu:0, the default stream, events that are
// always complete: the program order is the device's order).
// torchtpu.device.streams, which answers what the guard is asked about work on the
// device: PyTorch's generic `torch.Event(device="tpu")` and `torch.Stream(device="tpu")`
// reach the device only through the guard. Set by install(); a strong reference.
PyObject* g_streams = nullptr;

// torchtpu.device (torch.tpu), whose memory functions the allocator entry answers with.
// Set by install(); a strong reference.
PyObject* g_device = nullptr;

// Call `target.<name>(args)`, the GIL held; a Python exception becomes a C++ one with
// its type and message, which PyTorch's binding raises as a RuntimeError.
PyObject* callPython(PyObject* target, const char* name, PyObject* args) {
  PyObject* fn = PyObject_GetAttrString(target, name);
  PyObject* result = fn == nullptr ? nullptr : PyObject_CallObject(fn, args);
  Py_XDECREF(fn);
  if (result == nullptr) {
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);  // PyErr_GetRaisedException is Python 3.12+
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject* text = value == nullptr ? nullptr : PyObject_Str(value);
    const char* message = text == nullptr ? nullptr : PyUnicode_AsUTF8(text);
    // a plain RuntimeError keeps its words as they are (PyTorch raises a RuntimeError);
    // any other type is named in front of them (torchtpu.TpuAsyncError: ...)
    std::string what = message ? message : "";
    if (value == nullptr || Py_TYPE(value) != reinterpret_cast<PyTypeObject*>(PyExc_RuntimeError)) {
      what = std::string(value == nullptr ? "Error" : Py_TYPE(value)->tp_name) + ": " + what;
    }
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    PyErr_Clear();
    throw std::runtime_error(what);
  }
  return result;
}

// `target.<name>(*args)` under the GIL, its result read by `read` (which may not throw).
// The arguments are borrowed; the tuple is built once the GIL is held.
template <typename T, typename Read>
T withPython(PyObject* target, const char* name, std::initializer_list<PyObject*> args, Read read) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  Py_ssize_t i = 0;
  for (PyObject* arg : args) {
    Py_INCREF(arg);
    PyTuple_SET_ITEM(tuple, i++, arg);
  }
  try {
    PyObject* result = callPython(target, name, tuple);
    T value = read(result);
    Py_DECREF(result);
    Py_DECREF(tuple);
    PyGILState_Release(gil);
    return value;
  } catch (...) {
    Py_DECREF(tuple);
    PyGILState_Release(gil);
    throw;
  }
}

template <typename T, typename Read>
T withStreams(const char* name, std::initializer_list<PyObject*> args, Read read) {
  return withPython<T>(g_streams, name, args, read);
}

bool truthy(PyObject* o) { return PyObject_IsTrue(o) == 1; }

void TpuHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  PyObject* owner = impl->pyobj_slot()->load_pyobj();
  TORCH_CHECK(owner != nullptr,
              "torchtpu: this tpu storage has no device buffer to resize; create tpu tensors with torch "
              "factories or .to('tpu')");
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* size = PyLong_FromSize_t(newsize);
  uintptr_t pointer = 0;
  try {
    pointer = withPython<uintptr_t>(g_device, "_resize_storage", {owner, size}, [](PyObject* r) {
      return static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(r));
    });
  } catch (...) {
    Py_DECREF(size);
    PyGILState_Release(gil);
    throw;
  }
  Py_DECREF(size);
  PyGILState_Release(gil);
  impl->set_data_ptr_noswap(c10::DataPtr(reinterpret_cast<void*>(pointer), impl->device()));
  impl->set_nbytes(newsize);
}


int64_t statOf(PyObject* stats, const char* key) {
  PyObject* value = PyDict_GetItemString(stats, key);  // borrowed; absent reads as 0
  return value == nullptr ? 0 : PyLong_AsLongLong(value);
}

// The tpu device's entry in PyTorch's allocator registry. Device buffers are not
// allocated through it: a storage's buffer is made by the program that writes it and
// freed with the storage (torchtpu/tensor/storage.py), so `allocate` refuses with what to
// do -- without an entry, a C++ path that allocates for the tpu device crashed the
// process. What it answers is the statistics behind `torch.accelerator.memory_allocated`,
// `memory_stats`, `reset_peak_memory_stats`, `empty_cache` and `get_memory_info`, read
// from torch.tpu's functions of the same meaning (CUDA's allocator answers them itself).
struct TpuDeviceAllocator final : public c10::DeviceAllocator {
  c10::DataPtr allocate(size_t) override { refuse(); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override { refuse(); }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override { call("empty_cache"); }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one in-order queue
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override {
    c10::CachingDeviceAllocator::DeviceStats stats;
    withPython<bool>(g_device, "memory_stats", {}, [&stats](PyObject* d) {
      auto& count = stats.allocation[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      count.current = statOf(d, "allocation.all.current");
      count.allocated = statOf(d, "allocation.all.allocated");
      count.freed = statOf(d, "allocation.all.freed");
      for (auto* bytes : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes}) {
        auto& all = (*bytes)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
        all.current = statOf(d, "allocated_bytes.all.current");
        all.peak = statOf(d, "allocated_bytes.all.peak");
      }
      return true;
    });
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override { call("reset_accumulated_memory_stats"); }
  void resetPeakStats(c10::DeviceIndex) override { call("reset_peak_memory_stats"); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex) override {
    return withPython<std::pair<size_t, size_t>>(g_device, "mem_get_info", {}, [](PyObject* r) {
      return std::pair<size_t, size_t>(PyLong_AsSize_t(PyTuple_GetItem(r, 0)), PyLong_AsSize_t(PyTuple_GetItem(r, 1)));
    });
  }

 private:
  [[noreturn]] static void refuse() {
    TORCH_CHECK(false,
                "tpu device memory is not allocated through PyTorch's allocator: make tpu tensors with a factory "
                "(torch.empty(..., device='tpu')) or .to('tpu')");
  }
  static void call(const char* name) {
    withPython<bool>(g_device, name, {}, [](PyObject*) { return true; });
  }
};

// The device guard. One device, one in-order queue: every stream is the default stream
// and blocking a stream on an event has nothing to order. An event is a
// torchtpu.device.streams.Event recorded by `guard_record_event` (its pointer is a strong
// reference to it), so torch.Event and torch.tpu.Event mark, query, wait and time alike.
struct TpuGuard final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  // a factory's device="tpu:1" reaches its kernel through here (at::DeviceGuard)
  c10::Device exchangeDevice(c10::Device device) const override {
    check_index(device.index());
    return getDevice();
  }
  c10::Device getDevice() const override { return c10::Device(kType, 0); }
  void setDevice(c10::Device device) const override { check_index(device.index()); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override { return defaultStream(); }
  c10::Stream getNewStream(c10::Device, int) const override { return defaultStream(); }
  c10::Stream exchangeStream(c10::Stream) const noexcept override { return defaultStream(); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }

  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag flag) const override {
    // torch.Event(enable_timing=True) asks for the backend's default flag: a timing event
    PyObject* timing = flag == c10::EventFlag::BACKEND_DEFAULT ? Py_True : Py_False;
    PyObject* fresh = withStreams<PyObject*>("guard_record_event", {timing}, [](PyObject* r) {
      Py_INCREF(r);
      return r;
    });
    if (*event != nullptr) destroyEvent(*event, 0);  // re-recorded: the old mark goes
    *event = fresh;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void* event) const override {
    return event == nullptr || withStreams<bool>("guard_query_event", {static_cast<PyObject*>(event)}, truthy);
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      withStreams<bool>("guard_synchronize_event", {static_cast<PyObject*>(event)}, truthy);
    }
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calculating elapsed time.");
    return withStreams<double>(
        "guard_elapsed_time", {static_cast<PyObject*>(start), static_cast<PyObject*>(end)},
        [](PyObject* r) { return PyFloat_AsDouble(r); });
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event == nullptr || !Py_IsInitialized()) return;  // at exit the interpreter has freed it
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(static_cast<PyObject*>(event));
    PyGILState_Release(gil);
  }
  bool queryStream(const c10::Stream&) const override { return withStreams<bool>("guard_query_stream", {}, truthy); }
  void synchronizeStream(const c10::Stream&) const override { synchronizeDevice(0); }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    withStreams<bool>("guard_synchronize", {}, [](PyObject*) { return true; });
  }

 private:
  static c10::Stream defaultStream() { return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, 0)); }
};

PyObject* install(PyObject*, PyObject* args) {
  PyObject *streams = nullptr, *device = nullptr;
  if (!PyArg_ParseTuple(args, "OO", &streams, &device)) return nullptr;
  try {
    Py_INCREF(streams);
    Py_XDECREF(g_streams);
    g_streams = streams;
    Py_INCREF(device);
    Py_XDECREF(g_device);
    g_device = device;
    at::RegisterPrivateUse1HooksInterface(new TpuHooks());
    static TpuDeviceAllocator allocator;
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &allocator, std::numeric_limits<uint8_t>::max());
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
      static TpuGuard guard;
      c10::impl::registerDeviceGuard(c10::DeviceType::PrivateUse1, &guard);
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(streams, device): register the tpu device's C++ hooks, allocator entry and device guard (once, "
     "before any Python ones); the guard asks the module `streams` (torchtpu.device.streams) about events and "
     "the device's queue, the allocator entry asks `device` (torchtpu.device) for its memory statistics."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchtpu._hooks", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__hooks() { return PyModule_Create(&module); }
