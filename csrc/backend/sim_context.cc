// The device path on the simulated device (SMDDP_DEVICE_SIM=1, for tests),
// which plays the device under CUDA's rules (device/sim_device.h).
// Everything above the seam (device_collectives.cc: the staging, chunking,
// checks, Work and future) runs as it does for CUDA. Its tensors are either
// of two kinds:
// - the stand-in's torch device ("privateuseone:N", sim_torch_device.h):
//   ops are stream-ordered and futures carry the copies' events, so the
//   completion is CUDA's own code (device_future.h);
// - CPU tensors, which play device memory. One difference is forced on
//   them: CPU ops are not stream-ordered, and c10's futures over CPU
//   tensors carry no device events. Work::wait() and the future follow
//   CUDA's rules: a host read after either needs sim_synchronize().
//   Frameworks whose own code reads results on the host where CUDA would
//   order kernels (DDP unflattens a broadcast after wait(), its reducer
//   reads through the future) run with SMDDP_DEVICE_SIM_HOST_ORDER, which
//   makes that host code stand for kernels on the current stream: wait()
//   and the future then also wait, on the host, for the copies back.
#include "backend/sim_context.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "backend/device_future.h"
#include "backend/sim_torch_device.h"
#include "backend/work.h"
#include "common/error.h"
#include "common/param.h"
#include "device/sim_device.h"

namespace c10d_smddp {

SMDDP_PARAM_BOOL(paramDeviceSim, "SMDDP_DEVICE_SIM", false,
                 "Test hook: CPU collectives take the GPU path's staging pipeline on a "
                 "simulated device that follows CUDA's rules");
SMDDP_PARAM_INT(paramDeviceSimDelayUs, "SMDDP_DEVICE_SIM_DELAY_US", 0, 0, 1000000,
                "Test hook: each simulated device operation waits a random delay up to this");
SMDDP_PARAM_INT(paramDeviceSimQueues, "SMDDP_DEVICE_SIM_QUEUES", 8, 1, 128,
                "Test hook: hardware queues of the simulated device, as CUDA_DEVICE_MAX_CONNECTIONS");
SMDDP_PARAM_INT(paramDeviceSimOutDelayUs, "SMDDP_DEVICE_SIM_OUT_DELAY_US", 0, 0, 1000000,
                "Test hook: each operation on the stream the GPU path copies back on waits this "
                "much more (a busy copy engine)");
SMDDP_PARAM_BOOL(paramDeviceSimHostOrder, "SMDDP_DEVICE_SIM_HOST_ORDER", false,
                 "Test hook, for CPU tensors on the stand-in: host code after work.wait() counts "
                 "as a kernel on the current stream, so wait() also blocks the host until the "
                 "stream's waits are met (for frameworks such as DDP that read results on the "
                 "host). The stand-in's torch device (torch_smddp.testing.sim_torch_device) "
                 "orders such reads through streams and needs no such hook");

bool deviceSimRequested() { return paramDeviceSim(); }

void configureSimOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    smddp::SimDeviceOptions o;
    o.maxDelay = std::chrono::microseconds(paramDeviceSimDelayUs());
    o.queues = static_cast<int>(paramDeviceSimQueues());
    o.slowPool = 1;  // device_collectives.cc copies back on pool stream 1
    o.slowDelay = std::chrono::microseconds(paramDeviceSimOutDelayUs());
    const char* blocking = std::getenv("CUDA_LAUNCH_BLOCKING");
    o.launchBlocking = blocking && std::strcmp(blocking, "1") == 0;
    o.seed = 0x5eed;
    smddp::sim::setDefaults(o);
  });
}

namespace {

class SimContext : public DeviceContext {
 public:
  SimContext(c10::Device torch, int index, std::chrono::milliseconds timeout)
      : torch_(torch), index_(index), timeout_(timeout), device_(smddp::sim::deviceAt(index)) {}

  c10::Device torchDevice() const override { return torch_; }
  std::shared_ptr<smddp::Device> device() override { return device_; }

  std::shared_ptr<void> enter() override { return std::make_shared<smddp::sim::ScopedDevice>(index_); }
  bool capturing() override {
    return smddp::sim::isCapturing(*device_, smddp::sim::currentStream(*device_));
  }
  smddp::DeviceEventPtr callerReady() override {
    return smddp::sim::currentStream(*device_).record();
  }
  void streamWaits(const smddp::DeviceEventPtr& done) override {
    if (onTorchDevice()) return currentStreamWaits(torch_, done, &simTorchEventHandle);
    smddp::sim::currentStream(*device_).wait(done);
    // CPU ops are not stream-ordered: where host code stands for kernels
    // (DDP's unflatten after a broadcast), the host waits in their place.
    if (paramDeviceSimHostOrder() && done) waitOnHost(done, timeout_, "a collective's copies back");
  }
  void synchronizeCaller(std::chrono::milliseconds timeout) override {
    waitOnHost(smddp::sim::currentStream(*device_).record(), timeout, "the caller's stream");
  }
  void protect(const at::Tensor& t, smddp::DeviceStream& stream) override {
    if (!t.defined() || !t.has_storage()) return;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage(t.storage().getWeakStorageImpl());
    smddp::sim::recordStream(stream, [storage] { return !storage.expired(); });
    simTorchRecordStream(t, stream);
  }

  c10::intrusive_ptr<c10::ivalue::Future> newFuture() override {
    auto type = c10::ListType::create(c10::TensorType::get());
    if (!onTorchDevice()) return c10::make_intrusive<c10::ivalue::Future>(type);
    return c10::make_intrusive<c10::ivalue::Future>(type, std::vector<c10::Device>{torch_});
  }
  void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future, c10::IValue value,
                      const std::vector<smddp::DeviceEventPtr>& done) override {
    // On the stand-in's torch device, CUDA's own code: the future carries
    // the copies' events (device_future.h).
    if (onTorchDevice()) {
      device_->bindThread();
      return completeBehind(torch_, future, std::move(value), done, &simTorchEventHandle);
    }
    // On CPU tensors, as CUDA's, the future completes once the host part is done; a host
    // read of its value then needs sim_synchronize(). Where host code stands
    // for kernels (SMDDP_DEVICE_SIM_HOST_ORDER: DDP's reducer reads through
    // the future), the future waits for the copies back instead.
    if (!paramDeviceSimHostOrder()) {
      future->markCompleted(std::move(value));
      return;
    }
    // On the completion pool: its threads drive every device, relaxed.
    device_->bindThread();
    try {
      for (const auto& e : done) waitOnHost(e, timeout_, "a collective's copies back");
    } catch (const smddp::Error& e) {
      future->setError(toTorchError(std::make_exception_ptr(e)));
      return;
    }
    future->markCompleted(std::move(value));
  }

 private:
  bool onTorchDevice() const { return !torch_.is_cpu(); }
  void waitOnHost(const smddp::DeviceEventPtr& event, std::chrono::milliseconds timeout,
                  const char* what) {
    smddp::sim::hostWait(*device_, event, timeout, what);
  }

  c10::Device torch_;
  int index_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<smddp::Device> device_;
};

}  // namespace

std::shared_ptr<DeviceContext> makeSimContext(std::chrono::milliseconds timeout, c10::Device torch) {
  configureSimOnce();
  const int index = torch.is_cpu() ? smddp::sim::currentDevice() : torch.index();
  return std::make_shared<SimContext>(torch, index, timeout);
}

}  // namespace c10d_smddp
