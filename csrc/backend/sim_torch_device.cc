// The stand-in as a torch device (sim_torch_device.h): PrivateUse1, with
// - a device guard whose devices, streams and events are the simulated
//   device's (a thread's current device and stream, pool streams, events
//   recorded and waited on in the simulated queues);
// - an allocator of host memory that honours recordStream, as the CUDA
//   caching allocator does: memory a stream still uses is freed only once
//   the work queued on it so far has run;
// - ops that are kernels on the current stream: each first waits, on the
//   host, for what the current stream of its tensors' devices has queued,
//   then runs on the CPU (at::native::cpu_fallback). A read that CUDA would
//   order behind a collective's copies back is ordered only through
//   streams and events, so a future that does not carry its events, or a
//   stream that does not wait for them, shows as stale data.
// Nothing here is registered until enableSimTorchDevice() is called, so a
// user's own PrivateUse1 backend is never touched.
#include "backend/sim_torch_device.h"

#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/sim_context.h"
#include "common/error.h"
#include "device/sim_device.h"

namespace c10d_smddp {

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;
// The stand-in's torch devices: a host of eight GPUs.
constexpr c10::DeviceIndex kDevices = 8;
// Host waits of the stand-in's ops (a test's whole run is bounded below this).
constexpr std::chrono::seconds kHostWaitBound{300};

std::shared_ptr<smddp::Device> simDevice(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(index >= 0 && index < kDevices, "smddp stand-in: no device privateuseone:",
                    static_cast<int>(index), " (it has ", static_cast<int>(kDevices), ")");
  return smddp::sim::deviceAt(index);
}

// The calling thread's current device is `index` while this lives (a
// simulated queue takes work only from a thread on its device).
class OnDevice {
 public:
  explicit OnDevice(int index) : previous_(smddp::sim::exchangeDevice(index)) {}
  ~OnDevice() { smddp::sim::maybeSetDevice(previous_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_;
};

void hostWait(const smddp::DeviceEventPtr& event, const char* what) {
  const auto until = std::chrono::steady_clock::now() + kHostWaitBound;
  try {
    while (!event->query()) {
      TORCH_CHECK(std::chrono::steady_clock::now() < until, "smddp stand-in: ", what,
                  " did not complete within ", kHostWaitBound.count(), " s");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  } catch (const smddp::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// c10's StreamIds for the simulated streams: the default stream is 0, and
// every other stream gets the next id when c10 first sees it. Streams made
// for c10 (its pool, new streams) live as long as the process, as CUDA's.
class StreamIds {
 public:
  c10::Stream toC10(c10::DeviceIndex index, smddp::DeviceStream& stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, added] = ids_.try_emplace(&stream, static_cast<c10::StreamId>(byId_.size()));
    if (added) byId_.push_back(&stream);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, index), it->second);
  }
  smddp::DeviceStream& fromC10(const c10::Stream& stream) {
    const auto index = stream.device_index();
    if (stream.id() == 0) return smddp::sim::defaultStream(*simDevice(index));
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(stream.id() > 0 && static_cast<size_t>(stream.id()) < byId_.size(),
                "smddp stand-in: no stream ", stream.id());
    smddp::DeviceStream* s = byId_[static_cast<size_t>(stream.id())];
    TORCH_CHECK(smddp::sim::deviceOf(*s) == index, "smddp stand-in: stream ", stream.id(),
                " is not on privateuseone:", static_cast<int>(index));
    return *s;
  }
  c10::Stream owned(c10::DeviceIndex index, std::unique_ptr<smddp::DeviceStream> stream) {
    smddp::DeviceStream& s = *stream;
    {
      std::lock_guard<std::mutex> lock(mu_);
      owned_.push_back(std::move(stream));
    }
    return toC10(index, s);
  }
  c10::Stream pool(c10::DeviceIndex index) {
    constexpr size_t kPool = 4;
    std::unique_lock<std::mutex> lock(mu_);
    auto& mine = pools_[index];
    if (mine.size() < kPool) {
      lock.unlock();
      OnDevice on(index);
      auto made = owned(index, smddp::sim::newStream(*simDevice(index)));
      lock.lock();
      mine.push_back(made.id());
      return made;
    }
    const c10::StreamId id = mine[next_[index]++ % kPool];
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, index), id);
  }

  explicit StreamIds() { byId_.push_back(nullptr); }  // 0: the default stream

 private:
  std::mutex mu_;
  std::vector<smddp::DeviceStream*> byId_;
  std::unordered_map<smddp::DeviceStream*, c10::StreamId> ids_;
  std::vector<std::unique_ptr<smddp::DeviceStream>> owned_;
  std::unordered_map<c10::DeviceIndex, std::vector<c10::StreamId>> pools_;
  std::unordered_map<c10::DeviceIndex, size_t> next_;
};

StreamIds& streamIds() {
  static auto* ids = new StreamIds();  // outlives every tensor and future
  return *ids;
}

smddp::DeviceEventPtr* eventOf(void* handle) { return static_cast<smddp::DeviceEventPtr*>(handle); }

// torch destroys a future's events when the future goes, done or not; CUDA
// then releases a pending event once it completes. The stand-in's rule
// (its events are kept until done, as the library keeps its own) holds for
// the events c10 makes through this list.
class EventReaper {
 public:
  void destroy(smddp::DeviceEventPtr* event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (*event) pending_.push_back(std::move(*event));
    delete event;
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& e) {
                     try {
                       return e->query();
                     } catch (const smddp::Error&) {
                       return false;
                     }
                   }),
                   pending_.end());
  }

 private:
  std::mutex mu_;
  std::vector<smddp::DeviceEventPtr> pending_;
};

EventReaper& eventReaper() {
  static auto* r = new EventReaper();  // outlives every future
  return *r;
}

class SimGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check(d);
    return c10::Device(kType, static_cast<c10::DeviceIndex>(smddp::sim::exchangeDevice(d.index())));
  }
  c10::Device getDevice() const override {
    return c10::Device(kType, static_cast<c10::DeviceIndex>(smddp::sim::currentDevice()));
  }
  void setDevice(c10::Device d) const override {
    check(d);
    smddp::sim::setDevice(d.index());
  }
  // torch restores a guard's device this way: only where it has a context.
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    smddp::sim::maybeSetDevice(d.index());
  }
  c10::Stream getStream(c10::Device d) const override {
    return streamIds().toC10(d.index(), smddp::sim::currentStream(*simDevice(d.index())));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return streamIds().pool(d.index());
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    OnDevice on(d.index());
    return streamIds().owned(d.index(), smddp::sim::newStream(*simDevice(d.index())));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Stream previous = getStream(s.device());
    smddp::DeviceStream& next = streamIds().fromC10(s);
    auto dev = simDevice(s.device_index());
    smddp::sim::setCurrentStream(*dev, &next == &smddp::sim::defaultStream(*dev) ? nullptr : &next);
    return previous;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex index,
              const c10::EventFlag) const override {
    TORCH_CHECK(index == -1 || index == stream.device_index(), "smddp stand-in: an event of "
                "privateuseone:", static_cast<int>(index), " recorded on a stream of ",
                stream.device());
    if (!*event) *event = new smddp::DeviceEventPtr();
    OnDevice on(stream.device_index());
    *eventOf(*event) = streamIds().fromC10(stream).record();
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (!event || !*eventOf(event)) return;
    OnDevice on(stream.device_index());
    streamIds().fromC10(stream).wait(*eventOf(event));
  }
  bool queryEvent(void* event) const override {
    if (!event || !*eventOf(event)) return true;
    try {
      return (*eventOf(event))->query();
    } catch (const smddp::Error& e) {
      TORCH_CHECK(false, e.what());
    }
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event) eventReaper().destroy(eventOf(event));
  }
  void synchronizeEvent(void* event) const override {
    if (event && *eventOf(event)) hostWait(*eventOf(event), "an event");
  }
  bool queryStream(const c10::Stream& stream) const override {
    OnDevice on(stream.device_index());
    auto now = streamIds().fromC10(stream).record();
    return now->query();
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    smddp::DeviceEventPtr now;
    {
      OnDevice on(stream.device_index());
      now = streamIds().fromC10(stream).record();
    }
    hostWait(now, "a stream");
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    smddp::sim::synchronize(*simDevice(index), kHostWaitBound);
  }

 private:
  static void check(c10::Device d) {
    TORCH_CHECK(d.type() == kType && d.has_index() && d.index() < kDevices,
                "smddp stand-in: no device ", d);
  }
};

// What torch's generic code (the autograd engine's device threads,
// torch.accelerator) asks of PrivateUse1.
class SimHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    const auto all = smddp::sim::contexts();
    return std::find(all.begin(), all.end(), index) != all.end();
  }
  c10::DeviceIndex deviceCount() const override { return kDevices; }
  void setCurrentDevice(c10::DeviceIndex index) const override { smddp::sim::setDevice(index); }
  c10::DeviceIndex getCurrentDevice() const override { return currentSimTorchDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    return static_cast<c10::DeviceIndex>(smddp::sim::exchangeDevice(index));
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    const auto previous = getCurrentDevice();
    smddp::sim::maybeSetDevice(index);
    return previous;
  }
  bool isPinnedPtr(const void*) const override { return false; }
  at::Device getDeviceFromPtr(void*) const override {
    return c10::Device(kType, getCurrentDevice());
  }
  // Random numbers for the stand-in's tensors come from the CPU's generator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
};

// --- memory ---------------------------------------------------------------

// One allocation, and the streams recordStream named for it.
struct Block {
  void* data = nullptr;
  int device = 0;
  std::mutex mu;
  std::vector<smddp::DeviceStream*> streams;
};

// Freed blocks some stream still used: freed once their events complete.
struct Pending {
  Block* block;
  std::vector<smddp::DeviceEventPtr> events;
};

std::mutex gPendingMu;
std::list<Pending>* gPending = new std::list<Pending>();  // never destroyed

void destroy(Block* b) {
  c10::free_cpu(b->data);
  delete b;
}

// Frees what is no longer in use; returns nothing, never blocks.
void sweep() {
  std::lock_guard<std::mutex> lock(gPendingMu);
  for (auto it = gPending->begin(); it != gPending->end();) {
    const bool done = std::all_of(it->events.begin(), it->events.end(), [](const auto& e) {
      try {
        return e->query();
      } catch (const smddp::Error&) {
        return false;  // a failed device keeps its memory
      }
    });
    if (!done) {
      ++it;
      continue;
    }
    destroy(it->block);
    it = gPending->erase(it);
  }
}

void freeBlock(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  std::vector<smddp::DeviceStream*> streams;
  {
    std::lock_guard<std::mutex> lock(b->mu);
    streams.swap(b->streams);
  }
  if (streams.empty()) {
    destroy(b);
  } else {
    Pending p{b, {}};
    try {
      OnDevice on(b->device);
      for (auto* s : streams) p.events.push_back(s->record());
    } catch (...) {
      return;  // the device is gone (process exit): leave the memory
    }
    std::lock_guard<std::mutex> lock(gPendingMu);
    gPending->push_back(std::move(p));
  }
  sweep();
}

class SimAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    sweep();
    auto* b = new Block();
    b->device = smddp::sim::currentDevice();
    b->data = c10::alloc_cpu(bytes);
    return {b->data, b, &freeBlock, c10::Device(kType, static_cast<c10::DeviceIndex>(b->device))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

SimAllocator& allocator() {
  static auto* a = new SimAllocator();
  return *a;
}

// --- kernels --------------------------------------------------------------

// The op is a kernel on the current stream of `index`: it runs once what
// that stream has queued has run.
void behindCurrentStream(c10::DeviceIndex index) {
  smddp::DeviceEventPtr now;
  {
    OnDevice on(index);
    now = smddp::sim::currentStream(*simDevice(index)).record();
  }
  hostWait(now, "the current stream");
}

void behindTensors(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::DeviceIndex> seen;
  for (const auto& t : tensors) {
    if (!t.defined() || t.device().type() != kType) continue;
    const auto index = t.device().index();
    if (std::find(seen.begin(), seen.end(), index) != seen.end()) continue;
    seen.push_back(index);
    behindCurrentStream(index);
  }
}

// The same memory seen as a CPU tensor (it is host memory).
at::Tensor onCpu(const at::Tensor& t) {
  if (t.device().type() != kType) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

c10::DeviceIndex deviceIndexOr(std::optional<c10::Device> device) {
  return device && device->has_index() ? device->index()
                                       : static_cast<c10::DeviceIndex>(smddp::sim::currentDevice());
}

at::Tensor emptyMemoryFormat(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout>, std::optional<c10::Device> device,
                             std::optional<bool>, std::optional<c10::MemoryFormat> format) {
  OnDevice on(deviceIndexOr(device));
  return at::detail::empty_generic(size, &allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                        std::optional<c10::Device> device, std::optional<bool>) {
  OnDevice on(deviceIndexOr(device));
  return at::detail::empty_strided_generic(size, stride, &allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_CHECK((self.is_cpu() || self.device().type() == kType) &&
                  (dst.is_cpu() || dst.device().type() == kType),
              "smddp stand-in: copies between the CPU and privateuseone only, not ", self.device(),
              " to ", dst.device());
  behindTensors({self, dst});
  if (dst.numel() == 0) return dst;
  onCpu(dst).copy_(onCpu(self));
  return dst;
}

const at::Tensor& resizeTo(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const auto bytes = at::detail::computeStorageNbytesContiguous(size, impl->dtype().itemsize(),
                                                                impl->storage_offset());
  at::native::maybe_resize_storage_cpu(impl, bytes);
  if (format) {
    TORCH_CHECK(*format != c10::MemoryFormat::Preserve, "smddp stand-in: resize_ to ", *format);
    impl->empty_tensor_restride(*format);
  }
  return self;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  resizeTo(dst, self.sizes(), std::nullopt);
  return copyFrom(self, dst, false);
}

at::Tensor& setStorage(at::Tensor& self, c10::Storage source, int64_t offset,
                       c10::IntArrayRef size, c10::IntArrayRef stride) {
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  at::OptionalIntArrayRef strides = stride.data() ? at::OptionalIntArrayRef(stride) : std::nullopt;
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), size, strides, /*resize_storage=*/true);
  return self;
}

at::Tensor& setStorageWhole(at::Tensor& self, c10::Storage source) {
  const auto n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return setStorage(self, std::move(source), 0, {n}, {});
}

// Every other op: behind the current streams of its tensors' devices, on
// the CPU, over the same memory (it is host memory). The op runs on CPU
// tensors that alias each argument's whole storage, so what it writes
// lands in place even where its schema does not say so (native_batch_norm's
// running statistics); a result that aliases an argument comes back as a
// view of that argument, any other result is copied onto the device.
class OnCpu {
 public:
  c10::IValue in(const c10::IValue& v) {
    if (v.isTensor()) return alias(v.toTensor());
    if (v.isDevice() && v.toDevice().type() == kType) {
      target_ = v.toDevice();
      return c10::IValue(c10::Device(c10::kCPU));
    }
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(alias(t));
      return out;
    }
    if (v.isList()) {
      auto out = v.toList().copy();
      for (size_t k = 0; k < out.size(); ++k) out.set(k, in(out.get(k)));
      return out;
    }
    return v;
  }
  c10::IValue out(const c10::IValue& v) {
    if (v.isTensor()) return back(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(back(t));
      return list;
    }
    return v;
  }
  const std::vector<at::Tensor>& originals() const { return originals_; }

 private:
  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kType) return t;
    if (!target_) target_ = t.device();
    const c10::Storage& storage = t.storage();
    c10::Storage host(c10::Storage::use_byte_size_t(), storage.nbytes(),
                      c10::DataPtr(storage.mutable_data(), c10::Device(c10::kCPU)), nullptr, false);
    auto cpu = at::detail::make_tensor<c10::TensorImpl>(std::move(host), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    cpu.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    originals_.push_back(t);
    aliases_.push_back(cpu);
    return cpu;
  }
  at::Tensor back(const at::Tensor& cpu) {
    if (!cpu.defined() || cpu.device().type() == kType) return cpu;
    for (size_t k = 0; k < aliases_.size(); ++k) {
      if (cpu.unsafeGetTensorImpl() == aliases_[k].unsafeGetTensorImpl()) return originals_[k];
      if (cpu.has_storage() && cpu.storage().is_alias_of(aliases_[k].storage())) {
        auto view = at::detail::make_tensor<c10::TensorImpl>(
            c10::Storage(originals_[k].storage()), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
            cpu.dtype());
        view.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(),
                                                         cpu.storage_offset());
        return view;
      }
    }
    if (!target_) return cpu;  // an op on CPU tensors only
    OnDevice on(target_->has_index() ? target_->index() : currentSimTorchDevice());
    at::Tensor moved = at::detail::empty_generic(cpu.sizes(), &allocator(),
        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), cpu.scalar_type(), std::nullopt);
    if (moved.numel() > 0) onCpu(moved).copy_(cpu);
    return moved;
  }

  std::optional<c10::Device> target_;
  std::vector<at::Tensor> originals_;
  std::vector<at::Tensor> aliases_;
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema().arguments();
  if (std::any_of(schema.begin(), schema.end(), [](const auto& a) { return a.is_out(); })) {
    // out= ops may resize their outputs, which aliases cannot: torch's own
    // fallback copies them back, and their schema names every write.
    std::vector<at::Tensor> tensors;
    for (const auto& v : *stack) {
      if (v.isTensor()) tensors.push_back(v.toTensor());
    }
    behindTensors(tensors);
    return at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
  }
  OnCpu cpu;
  const size_t args = op.schema().arguments().size();
  const size_t first = stack->size() - args;
  for (size_t k = first; k < stack->size(); ++k) (*stack)[k] = cpu.in((*stack)[k]);
  behindTensors(cpu.originals());
  op.callBoxed(stack);
  const size_t results = op.schema().returns().size();
  for (size_t k = stack->size() - results; k < stack->size(); ++k) (*stack)[k] = cpu.out((*stack)[k]);
}

struct Registration {
  c10::impl::DeviceGuardImplRegistrar guard{kType, new SimGuardImpl()};
  torch::Library kernels{torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                         __LINE__};
  torch::Library others{torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__,
                        __LINE__};
};

}  // namespace

namespace {
std::atomic<bool> gEnabled{false};
}  // namespace

void enableSimTorchDevice() {
  static std::once_flag once;
  static Registration* registration = nullptr;
  TORCH_CHECK(registration || !c10::impl::hasDeviceGuardImpl(kType),
              "smddp stand-in: another extension already owns the PrivateUse1 device");
  std::call_once(once, [] {
    configureSimOnce();
    c10::SetAllocator(kType, &allocator());
    at::RegisterPrivateUse1HooksInterface(new SimHooks());
    auto* r = new Registration();  // for the process's life, as TORCH_LIBRARY_IMPL's
    r->kernels.impl("empty.memory_format", &emptyMemoryFormat);
    r->kernels.impl("empty_strided", &emptyStrided);
    r->kernels.impl("_copy_from", &copyFrom);
    r->kernels.impl("_copy_from_and_resize", &copyFromAndResize);
    r->kernels.impl("resize_", &resizeTo);
    r->kernels.impl("set_.source_Storage", &setStorageWhole);
    r->kernels.impl("set_.source_Storage_storage_offset", &setStorage);
    r->kernels.impl("as_strided", &at::native::as_strided_tensorimpl);
    r->kernels.impl("view", &at::native::view);
    r->kernels.impl("_reshape_alias", &at::native::_reshape_alias);
    r->kernels.impl("unfold", &at::native::unfold);
    r->others.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
    registration = r;
    gEnabled = true;
  });
}

bool simTorchDeviceEnabled() { return gEnabled.load(); }

c10::DeviceIndex currentSimTorchDevice() {
  return static_cast<c10::DeviceIndex>(smddp::sim::currentDevice());
}

void simTorchRecordStream(const at::Tensor& t, smddp::DeviceStream& stream) {
  if (!t.defined() || !t.has_storage() || t.device().type() != kType) return;
  const c10::DataPtr& ptr = t.storage().data_ptr();
  if (ptr.get_deleter() != &freeBlock) return;  // not this allocator's
  auto* b = static_cast<Block*>(ptr.get_context());
  std::lock_guard<std::mutex> lock(b->mu);
  if (std::find(b->streams.begin(), b->streams.end(), &stream) == b->streams.end()) {
    b->streams.push_back(&stream);
  }
}

void* simTorchEventHandle(const smddp::DeviceEventPtr& event) {
  return const_cast<smddp::DeviceEventPtr*>(&event);
}

}  // namespace c10d_smddp
