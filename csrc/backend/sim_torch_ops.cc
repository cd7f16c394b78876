// The stand-in's torch device (sim_torch_device.h): its memory and ops.
// - An allocator of host memory that honours recordStream, as the CUDA
//   caching allocator does: memory a stream still uses is freed only once
//   the work queued on it so far has run.
// - Ops that are kernels on the current stream: each first waits, on the
//   host, for what the current stream of its tensors' devices has queued,
//   then runs on the CPU over the same memory. A read that CUDA would
//   order behind a collective's copies back is ordered only through
//   streams and events, so a future that does not carry its events, or a
//   stream that does not wait for them, shows as stale data.
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "backend/sim_torch_device.h"
#include "backend/sim_torch_internal.h"
#include "common/error.h"
#include "device/reaper.h"

namespace c10d_smddp {

namespace simtorch {

namespace {

// --- memory ---------------------------------------------------------------

// One allocation, and the streams recordStream named for it.
struct Block {
  void* data = nullptr;
  int device = 0;
  std::mutex mu;
  std::vector<smddp::DeviceStream*> streams;
};

void destroy(Block* b) {
  c10::free_cpu(b->data);
  delete b;
}

// Memory some stream still uses goes to the device's reaper with an event
// on each such stream, and is freed once they have all completed.
void freeBlock(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  std::vector<smddp::DeviceStream*> streams;
  {
    std::lock_guard<std::mutex> lock(b->mu);
    streams.swap(b->streams);
  }
  if (streams.empty()) return destroy(b);
  std::shared_ptr<void> memory(b, [](void* p) { destroy(static_cast<Block*>(p)); });
  try {
    OnDevice on(b->device);
    auto& reaper = smddp::DeviceReaper::of(simDevice(static_cast<c10::DeviceIndex>(b->device)));
    for (auto* s : streams) reaper.release(s->record(), memory);
  } catch (...) {
    smddp::DeviceReaper::keepForever(std::move(memory));  // the device failed: keep it
  }
}

class SimAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
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

SimAllocator& simAllocator() {
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
  hostWait(index, now, "the current stream");
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
  return at::detail::empty_generic(size, &simAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                        std::optional<c10::Device> device, std::optional<bool>) {
  OnDevice on(deviceIndexOr(device));
  return at::detail::empty_strided_generic(size, stride, &simAllocator(),
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
    OnDevice on(target_->has_index() ? target_->index() : currentDevice());
    at::Tensor moved = at::detail::empty_generic(cpu.sizes(), &simAllocator(),
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

}  // namespace

c10::Allocator* allocator() { return &simAllocator(); }

void resizeBytes(const c10::Storage& storage, size_t bytes) {
  TORCH_CHECK(storage.resizable(), "smddp stand-in: the storage is not resizable");
  const auto index = storage.device().index();
  behindCurrentStream(index);
  c10::DataPtr fresh;
  {
    OnDevice on(index);
    fresh = simAllocator().allocate(bytes);
  }
  const size_t kept = std::min(bytes, storage.nbytes());
  if (kept > 0) std::memcpy(fresh.get(), storage.data(), kept);
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(bytes);
}

void registerOps(torch::Library& aten, torch::Library& others) {
  aten.impl("empty.memory_format", &emptyMemoryFormat);
  aten.impl("empty_strided", &emptyStrided);
  aten.impl("_copy_from", &copyFrom);
  aten.impl("_copy_from_and_resize", &copyFromAndResize);
  aten.impl("resize_", &resizeTo);
  aten.impl("set_.source_Storage", &setStorageWhole);
  aten.impl("set_.source_Storage_storage_offset", &setStorage);
  aten.impl("as_strided", &at::native::as_strided_tensorimpl);
  aten.impl("view", &at::native::view);
  aten.impl("_reshape_alias", &at::native::_reshape_alias);
  aten.impl("unfold", &at::native::unfold);
  others.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

}  // namespace simtorch

void simTorchRecordStream(const at::Tensor& t, smddp::DeviceStream& stream) {
  using simtorch::Block;
  if (!t.defined() || !t.has_storage() || t.device().type() != simtorch::kType) return;
  const c10::DataPtr& ptr = t.storage().data_ptr();
  if (ptr.get_deleter() != &simtorch::freeBlock) return;  // not this allocator's
  auto* b = static_cast<Block*>(ptr.get_context());
  std::lock_guard<std::mutex> lock(b->mu);
  if (std::find(b->streams.begin(), b->streams.end(), &stream) == b->streams.end()) {
    b->streams.push_back(&stream);
  }
}

}  // namespace c10d_smddp
