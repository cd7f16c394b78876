// The stand-in as a torch device (sim_torch_device.h): PrivateUse1, with a
// device guard whose devices, streams and events are the simulated
// device's (a thread's current device and stream, pool streams, events
// recorded and waited on in the simulated queues), the hooks torch's
// generic code asks for, and the memory and ops of sim_torch_ops.cc.
// Nothing here is registered until enableSimTorchDevice() is called, so a
// user's own PrivateUse1 backend is never touched.
#include "backend/sim_torch_device.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/sim_context.h"
#include "backend/sim_torch_internal.h"
#include "common/error.h"
#include "device/reaper.h"
#include "device/sim_device.h"

namespace c10d_smddp {

namespace {

using simtorch::hostWait;
using simtorch::kDevices;
using simtorch::kHostWaitBound;
using simtorch::kType;
using simtorch::OnDevice;
using simtorch::simDevice;

// every other stream gets the next id when c10 first sees it. Streams made
// for c10 (its pool, new streams) live as long as the process, as CUDA's.
class StreamIds {
 public:
  c10::Stream toC10(c10::DeviceIndex index, smddp::DeviceStream& stream) {
    if (&stream == &smddp::sim::defaultStream(*simDevice(index))) {
      return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, index), 0);
    }
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
  // torch destroys a future's events when the future goes, done or not;
  // CUDA then releases a pending event once it completes. The stand-in's
  // rule (its events are kept until done, as the library keeps its own)
  // holds for c10's through the device's reaper.
  void destroyEvent(void* event, const c10::DeviceIndex index) const noexcept override {
    if (!event) return;
    std::unique_ptr<smddp::DeviceEventPtr> owned(eventOf(event));
    try {
      const auto at = index >= 0 ? index : simtorch::currentDevice();
      smddp::DeviceReaper::of(simDevice(at)).release(std::move(*owned), nullptr);
    } catch (...) {
      smddp::DeviceReaper::keepForever(std::make_shared<smddp::DeviceEventPtr>(std::move(*owned)));
    }
  }
  void synchronizeEvent(void* event) const override {
    if (event && *eventOf(event)) hostWait(simtorch::currentDevice(), *eventOf(event), "an event");
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
    hostWait(stream.device_index(), now, "a stream");
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
  c10::DeviceIndex getCurrentDevice() const override { return simtorch::currentDevice(); }
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
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    simtorch::resizeBytes(storage, bytes);
  }
  // Random numbers for the stand-in's tensors come from the CPU's generator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
};

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
    c10::SetAllocator(kType, simtorch::allocator());
    at::RegisterPrivateUse1HooksInterface(new SimHooks());
    auto* r = new Registration();  // for the process's life, as TORCH_LIBRARY_IMPL's
    simtorch::registerOps(r->kernels, r->others);
    registration = r;
    gEnabled = true;
  });
}

bool simTorchDeviceEnabled() { return gEnabled.load(); }

c10::DeviceIndex currentSimTorchDevice() {
  return static_cast<c10::DeviceIndex>(smddp::sim::currentDevice());
}

void* simTorchEventHandle(const smddp::DeviceEventPtr& event) {
  return const_cast<smddp::DeviceEventPtr*>(&event);
}

}  // namespace c10d_smddp
