// The device seam (device.h) on CPU threads, under CUDA's rules, so that CI
// catches what a GPU would. "Device memory" is host memory; what the
// stand-in models:
// - hardware queues: streams map onto `queues` in-order queues
//   (CUDA_DEVICE_MAX_CONNECTIONS); each queue runs its work in the order it
//   was queued, so a wait at the head of a queue holds back everything
//   behind it, whatever stream it came from;
// - random delays per operation, so queues complete out of order;
// - a current device per thread: a thread that touches a device other than
//   its current one breaks the rules, and setting a device makes a context
//   on it (contexts() lists them, as nvidia-smi lists processes per GPU);
//   so does destroying an event, on the destroying thread's current device
//   (device 0 for a thread never bound), as cudaEventDestroy does;
// - a current stream per thread and device (the default stream until
//   changed), which the library's readiness events are recorded on;
// - capture (torch.cuda.graph's global mode): while a stream captures, an
//   event query or a host wait from a thread not in relaxed mode is an error;
// - lifetimes: destroying a stream or an event with work pending, or a
//   stream a live tensor's recordStream refers to, is an error; so is a
//   copy into page-locked memory already freed;
// - CUDA_LAUNCH_BLOCKING: each operation returns only once it has run.
// A broken rule throws an Error (kInternal) where it happens and is kept in
// violations(), which the test harness checks after every simulated run.
// The queues are sim_device.cc; the record of broken rules, contexts, freed
// page-locked memory and copies is sim_rules.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"

namespace smddp {

struct SimDeviceOptions {
  int index = 0;
  // Each queued operation waits a random delay in [0, maxDelay] before it runs.
  std::chrono::microseconds maxDelay{0};
  uint64_t seed = 1;
  int queues = 8;               // hardware queues (CUDA_DEVICE_MAX_CONNECTIONS)
  bool launchBlocking = false;  // CUDA_LAUNCH_BLOCKING=1
  // Test hook: the copy with this index (0-based, counted over all streams
  // of the device in the order they were queued) never completes, and
  // stalls its queue; -1 for none.
  int64_t hangCopy = -1;
  // Test hook: every operation on pool stream `slowPool` waits `slowDelay`
  // more (a busy copy engine); -1 for none.
  int slowPool = -1;
  std::chrono::microseconds slowDelay{0};
  // Test hook: called on the queue's thread after each copy.
  std::function<void(void* dst, const void* src, size_t bytes)> afterCopy;
};

// A device of its own (Catch2 tests); destroying it stops its queues.
std::shared_ptr<Device> makeSimDevice(SimDeviceOptions opts = {});

namespace sim {

// The process's simulated device `index` (SMDDP_DEVICE_SIM), made on first
// use with setDefaults()' options; it lives as long as the process.
std::shared_ptr<Device> deviceAt(int index);
void setDefaults(SimDeviceOptions opts);

// What torch.cuda offers a caller's thread.
void setDevice(int index);  // makes a context on `index`
int currentDevice();
// Sets the current device and returns the previous one; restoring sets it
// only where the previous device has a context (torch's MaybeSetDevice).
int exchangeDevice(int index);
void maybeSetDevice(int index);
// While it lives, the calling thread's current device is `index` (torch's
// device guard: exchangeDevice, then maybeSetDevice back).
class ScopedDevice {
 public:
  explicit ScopedDevice(int index) : previous_(exchangeDevice(index)) {}
  ~ScopedDevice() { maybeSetDevice(previous_); }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_;
};
DeviceStream& currentStream(Device& device);
// The stream every thread starts on (CUDA's default stream).
DeviceStream& defaultStream(Device& device);
// A new stream (torch.cuda.Stream()); the caller owns it.
std::unique_ptr<DeviceStream> newStream(Device& device);
void setCurrentStream(Device& device, DeviceStream* stream);  // null: the default stream
// Capture on the calling thread's current stream (torch.cuda.graph).
void beginCapture(Device& device);
void endCapture(Device& device);
bool isCapturing(Device& device, DeviceStream& stream);
// Host waits (torch.cuda.synchronize): every queued operation has run.
// Throws kTimeout past `timeout`.
void synchronize(Device& device, std::chrono::milliseconds timeout);
// The host waits until `event` of `device` has completed; throws kTimeout,
// naming `what`, past `timeout`.
void hostWait(Device& device, const DeviceEventPtr& event, std::chrono::milliseconds timeout,
              const std::string& what);
// A kernel that fills `bytes` at `dst` with copies of `pattern`.
void fill(DeviceStream& stream, void* dst, size_t bytes, std::vector<uint8_t> pattern);
// A kernel whose body runs on the host (the simulated NCCL collectives).
void hostKernel(DeviceStream& stream, std::function<void()> body);
// The caching allocator's recordStream: while `referenced()` holds, the
// stream must not be destroyed.
void recordStream(DeviceStream& stream, std::function<bool()> referenced);
// Copies whose source lay in [begin, begin + bytes), over every device.
uint64_t copiesFrom(const void* begin, size_t bytes);
// The index of the device `stream` belongs to.
int deviceOf(DeviceStream& stream);
// A rule broken outside the device itself (the simulated NCCL): kept in
// violations() and logged, as the device's own are.
void recordViolation(const std::string& what);

std::vector<int> contexts();
std::vector<std::string> violations();
void clearViolations();

}  // namespace sim

}  // namespace smddp
