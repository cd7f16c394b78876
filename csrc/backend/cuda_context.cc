// DeviceContext for one CUDA device: the caller's current device and
// stream, capture, the caching allocator and c10d's CUDA-aware futures, on
// top of CudaDevice (device/cuda/cuda_device.h). With no_cuda.cc, the only
// place the backend meets c10::cuda.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <thread>

#include "backend/device_context.h"
#include "backend/device_future.h"
#include "backend/intra.h"
#include "common/error.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/nccl_intra.h"

namespace c10d_smddp {

namespace {

class CudaContext : public DeviceContext {
 public:
  explicit CudaContext(c10::DeviceIndex index)
      : index_(index), device_(smddp::CudaDevice::at(index)) {}

  c10::Device torchDevice() const override { return c10::Device(c10::kCUDA, index_); }
  std::shared_ptr<smddp::Device> device() override { return device_; }

  std::shared_ptr<void> enter() override {
    // torch's guard: it restores the previous device with MaybeSetDevice,
    // so a thread that had no context on it does not get one.
    return std::make_shared<c10::cuda::CUDAGuard>(index_);
  }
  bool capturing() override { return device_->capturing(current()); }
  smddp::DeviceEventPtr callerReady() override { return device_->recordOn(current()); }
  void streamWaits(const smddp::DeviceEventPtr& done) override {
    currentStreamWaits(torchDevice(), done, handle());
  }
  void synchronizeCaller(std::chrono::milliseconds timeout) override {
    auto event = device_->recordOn(current());
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!event->query()) {
      SMDDP_CHECK(std::chrono::steady_clock::now() < until, kTimeout,
                  device_->name() + ": the caller's stream did not drain within " +
                      std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void protect(const at::Tensor& t, smddp::DeviceStream& stream) override {
    if (!t.defined() || !t.is_cuda() || !t.has_storage()) return;
    // The allocator skips memory it did not hand out (the DataPtr's deleter
    // is not its own), so this is safe for any CUDA tensor. Pool streams
    // live as long as the process, so the record never outlives them.
    c10::cuda::CUDACachingAllocator::recordStream(
        t.storage().data_ptr(),
        c10::cuda::getStreamFromExternal(smddp::CudaDevice::native(stream), index_));
  }

  c10::intrusive_ptr<c10::ivalue::Future> newFuture() override {
    return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                   std::vector<c10::Device>{torchDevice()});
  }

  void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future, c10::IValue value,
                      const std::vector<smddp::DeviceEventPtr>& done) override {
    completeBehind(torchDevice(), future, std::move(value), done, handle());
  }

 private:
  cudaStream_t current() const { return c10::cuda::getCurrentCUDAStream(index_).stream(); }
  // c10's CUDA events are cudaEvent_t handles.
  EventHandle handle() const {
    return [this](const smddp::DeviceEventPtr& e) { return static_cast<void*>(native(e)); };
  }
  cudaEvent_t native(const smddp::DeviceEventPtr& event) const {
    auto* e = dynamic_cast<smddp::CudaEvent*>(event.get());
    SMDDP_CHECK(e, kInternal, device_->name() + ": an event of another kind of device");
    return e->native();
  }

  c10::DeviceIndex index_;
  std::shared_ptr<smddp::CudaDevice> device_;
};

}  // namespace

std::shared_ptr<DeviceContext> makeCudaContext(c10::DeviceIndex index) {
  c10::cuda::CUDAGuard guard(index);  // CudaDevice::at checks the index
  return std::make_shared<CudaContext>(index);
}

bool builtWithCuda() { return true; }

std::shared_ptr<smddp::NcclApi> cudaNcclApi() { return smddp::cudaNccl(); }

int cudaDeviceCount() { return static_cast<int>(c10::cuda::device_count()); }

c10::DeviceIndex currentCudaDevice() { return c10::cuda::current_device(); }

}  // namespace c10d_smddp
