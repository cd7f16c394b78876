#include "backend/device_future.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace c10d_smddp {

void currentStreamWaits(c10::Device device, const smddp::DeviceEventPtr& done,
                        const EventHandle& handle) {
  if (!done) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  impl.block(handle(done), impl.getStream(device));
}

void completeBehind(c10::Device device, const c10::intrusive_ptr<c10::ivalue::Future>& future,
                    c10::IValue value, const std::vector<smddp::DeviceEventPtr>& done,
                    const EventHandle& handle) {
  c10::impl::VirtualGuardImpl impl(device.type());
  c10::DeviceGuard guard(device);
  const c10::Stream stream = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  for (const auto& e : done) {
    if (e) impl.block(handle(e), stream);
  }
  c10::StreamGuard streamGuard(stream);
  future->markCompleted(std::move(value));
}

}  // namespace c10d_smddp
