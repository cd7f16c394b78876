// Memory the device may still use is freed only once the device is done
// with it. A pipeline that shuts down, a call whose Work is dropped, or a
// group that is aborted hands its staging memory and tensors here with the
// event after their last use; one thread per device, bound to it, frees
// them once those events complete. The reaper lives as long as the process.
#pragma once

#include <memory>

#include "device/device.h"

namespace smddp {

class DeviceReaper {
 public:
  // The reaper of `device` (one per device name, made on first use).
  static DeviceReaper& of(const std::shared_ptr<Device>& device);

  // Keeps `payload` alive until `after` has completed (or the device
  // failed; then it is kept for good). Null `after`: freed at once.
  virtual void release(DeviceEventPtr after, std::shared_ptr<void> payload) = 0;
  // Keeps `payload` for the life of the process: the device failed, and
  // may still use it.
  static void keepForever(std::shared_ptr<void> payload);
  // How many payloads still wait for their event (tests).
  virtual size_t pending() const = 0;

 protected:
  virtual ~DeviceReaper() = default;
};

}  // namespace smddp
