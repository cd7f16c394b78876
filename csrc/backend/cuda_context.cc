// DeviceContext for one CUDA device: the caller's current stream, the
// caching allocator and c10d's CUDA-aware futures, on top of CudaDevice.
// With backend/no_cuda.cc, the only place the backend meets c10::cuda.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <thread>

#include "backend/device_context.h"
#include "common/error.h"
#include "device/cuda/cuda_device.h"

namespace c10d_smddp {

namespace {

class CudaContext : public DeviceContext {
 public:
  explicit CudaContext(c10::DeviceIndex index)
      : index_(index), device_(std::make_shared<smddp::CudaDevice>(index)) {}

  c10::Device torchDevice() const override { return c10::Device(c10::kCUDA, index_); }
  std::shared_ptr<smddp::Device> device() override { return device_; }

  smddp::DeviceEventPtr callerReady() override {
    return device_->recordOn(c10::cuda::getCurrentCUDAStream(index_).stream());
  }

  void protect(const at::Tensor& t) override {
    if (!t.defined() || !t.is_cuda() || !t.has_storage()) return;
    // The allocator skips memory it did not hand out (the DataPtr's deleter
    // is not its own), so this is safe for any CUDA tensor.
    for (cudaStream_t s : device_->streams()) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(),
                                                    c10::cuda::getStreamFromExternal(s, index_));
    }
  }

  void callerWaits(const smddp::DeviceEventPtr& done, std::chrono::milliseconds timeout) override {
    if (!done) return;
    if (auto* event = dynamic_cast<smddp::CudaEvent*>(done.get())) {
      c10::cuda::CUDAGuard guard(index_);
      C10_CUDA_CHECK(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(index_).stream(), event->native(), 0));
      return;
    }
    // Not an event of this device (it should be): the host waits instead.
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done->query()) {
      SMDDP_CHECK(std::chrono::steady_clock::now() < deadline, kTimeout,
                  device_->name() + ": timed out after " + std::to_string(timeout.count()) +
                      " ms waiting for a collective's device work");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  c10::intrusive_ptr<c10::ivalue::Future> newFuture() override {
    return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                   std::vector<c10::Device>{torchDevice()});
  }

  void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future, c10::IValue value,
                      const smddp::DeviceEventPtr& done) override {
    c10::cuda::CUDAGuard guard(index_);
    // markCompleted records the future's events on the current stream: a
    // pool stream that first waits for `done`, so whoever waits on the
    // future (or a then() callback) sees the finished tensors, and the
    // caller's own stream is not held up by the wait.
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_);
    if (done) {
      auto* event = dynamic_cast<smddp::CudaEvent*>(done.get());
      SMDDP_CHECK(event, kInternal,
                  device_->name() + ": a future was to complete after an event of another device kind");
      C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), event->native(), 0));
    }
    c10::cuda::CUDAStreamGuard streamGuard(stream);
    future->markCompleted(std::move(value));
  }

  at::Tensor hostBuffer(size_t bytes) override {
    return at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  }

 private:
  c10::DeviceIndex index_;
  std::shared_ptr<smddp::CudaDevice> device_;
};

}  // namespace

std::unique_ptr<DeviceContext> makeCudaContext(c10::DeviceIndex index) {
  return std::make_unique<CudaContext>(index);
}

bool builtWithCuda() { return true; }

}  // namespace c10d_smddp
