// The device path on CPU tensors (SMDDP_DEVICE_SIM=1, for tests): CPU
// tensors play device memory, the simulated device (device/sim_device.h)
// plays the streams. Everything above the seam (device_collectives.cc: the
// staging, chunking, checks, Work and future) runs as it does for CUDA.
#include "backend/sim_context.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <thread>

#include "common/param.h"
#include "device/sim_device.h"

namespace c10d_smddp {

SMDDP_PARAM_BOOL(paramDeviceSim, "SMDDP_DEVICE_SIM", false,
                 "Test hook: CPU collectives take the GPU path's staging pipeline on a "
                 "simulated device");
SMDDP_PARAM_INT(paramDeviceSimDelayUs, "SMDDP_DEVICE_SIM_DELAY_US", 0, 0, 1000000,
                "Test hook: each simulated device operation waits a random delay up to this");

bool deviceSimRequested() { return paramDeviceSim(); }

namespace {

class SimContext : public DeviceContext {
 public:
  explicit SimContext(int rank) {
    smddp::SimDeviceOptions o;
    o.maxDelay = std::chrono::microseconds(paramDeviceSimDelayUs());
    o.seed = 0x5eed + rank;
    device_ = smddp::makeSimDevice(o);
  }
  c10::Device torchDevice() const override { return c10::Device(c10::kCPU); }
  std::shared_ptr<smddp::Device> device() override { return device_; }
  smddp::DeviceEventPtr callerReady() override { return nullptr; }  // CPU tensors are ready
  void protect(const at::Tensor&) override {}  // DeviceCollectives holds them until done
  bool blocksHost() const override { return true; }
  void callerWaits(const smddp::DeviceEventPtr& done, std::chrono::milliseconds timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!done->query()) {
      TORCH_CHECK(std::chrono::steady_clock::now() < until,
                  "smddp: the simulated device's copies did not complete within the timeout");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> newFuture() override {
    return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  }
  void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future, c10::IValue value,
                      const smddp::DeviceEventPtr& done) override {
    // The copies back are queued behind the host flag that was raised
    // before this runs, so they land soon; the future's value must be final.
    while (!done->query()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    future->markCompleted(std::move(value));
  }
  at::Tensor hostBuffer(size_t bytes) override {
    return at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
  }

 private:
  std::shared_ptr<smddp::Device> device_;
};

}  // namespace

std::unique_ptr<DeviceContext> makeSimContext(int rank) {
  return std::make_unique<SimContext>(rank);
}

}  // namespace c10d_smddp
