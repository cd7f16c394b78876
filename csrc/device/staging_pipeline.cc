#include "device/staging_pipeline.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/error.h"
#include "common/logging.h"

namespace smddp {

struct StagingPipeline::Item {
  StagingCall call;
  uint64_t firstTicket = 0;
  std::vector<DeviceEventPtr> landed;  // per chunk: its copies in are done
};

struct StagingPipeline::Core {
  std::string deviceName;
  std::chrono::milliseconds timeout;
  std::shared_ptr<HostFlag> flag;
  std::vector<std::shared_ptr<void>> slotMemory;
  std::atomic<bool> stopping{false};  // `stop`, for the polling loop without the mutex

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Item>> queue;  // calls not yet done, in submit order
  std::exception_ptr broken;
  bool stop = false;
  bool exited = false;  // the thread has returned
};

namespace {

constexpr uint64_t kFlagMax = UINT64_MAX;  // releases every waitHost

std::exception_ptr aborted(const StagingCall& call, const std::string& device) {
  return std::make_exception_ptr(Error(
      ErrorKind::kAborted, "smddp: " + call.what + ": the staging pipeline of device " + device +
                               " was shut down"));
}

// done() belongs to the caller; an exception from it must not take the
// pipeline thread down with it.
void finish(StagingCall& call, std::exception_ptr cause) {
  if (!call.done) return;
  try {
    call.done(std::move(cause));
  } catch (const std::exception& e) {
    SMDDP_LOG(kError) << "smddp: " << call.what << ": completion callback threw: " << e.what();
  } catch (...) {
    SMDDP_LOG(kError) << "smddp: " << call.what << ": completion callback threw";
  }
}

}  // namespace

StagingPipeline::StagingPipeline(std::shared_ptr<Device> device, StagingOptions opts)
    : device_(std::move(device)), opts_(opts), core_(std::make_shared<Core>()) {
  SMDDP_CHECK(device_ != nullptr, kInvalidArgument, "smddp: staging pipeline without a device");
  SMDDP_CHECK(opts_.copyStreams >= 1 && opts_.slots >= 0 && opts_.timeout.count() > 0,
              kInvalidArgument,
              "smddp: staging pipeline options: copyStreams " +
                  std::to_string(opts_.copyStreams) + " (needs >= 1), slots " +
                  std::to_string(opts_.slots) + " (needs >= 0), timeout " +
                  std::to_string(opts_.timeout.count()) + " ms (needs > 0)");
  core_->deviceName = device_->name();
  core_->timeout = opts_.timeout;
  core_->flag = device_->newHostFlag();
  for (int i = 0; i < opts_.slots; ++i) {
    core_->slotMemory.push_back(device_->allocHost(opts_.slotBytes));
  }
  slotFree_.resize(opts_.slots);
  for (int i = 0; i < opts_.copyStreams; ++i) copyIn_.push_back(device_->newStream());
  copyOut_ = device_->newStream();
  thread_ = std::thread(run, core_);
}

StagingPipeline::~StagingPipeline() {
  shutdown();
  // Streams before slots (core_): their queued copies use the slots.
  copyIn_.clear();
  copyOut_.reset();
}

DeviceEventPtr StagingPipeline::submit(StagingCall call) {
  // Checked before any ticket is taken: a refused call queues nothing.
  for (size_t k = 0; k < call.chunks.size(); ++k) {
    const StagingChunk& chunk = call.chunks[k];
    if (!chunk.slotted) continue;
    for (const auto* copies : {&chunk.in, &chunk.out}) {
      for (const StageCopy& c : *copies) {
        const auto offset = reinterpret_cast<uintptr_t>(c.host);
        if (opts_.slots > 0 && offset <= opts_.slotBytes && c.bytes <= opts_.slotBytes - offset) {
          continue;
        }
        throwError(ErrorKind::kInvalidArgument,
                   "smddp: " + call.what + ": chunk " + std::to_string(k) + " stages " +
                       std::to_string(c.bytes) + " bytes at offset " + std::to_string(offset) +
                       " of a staging slot of " + std::to_string(opts_.slotBytes) + " bytes (" +
                       std::to_string(opts_.slots) + " slots)");
      }
    }
  }

  Core& core = *core_;
  std::unique_lock<std::mutex> lk(core.mu);
  if (core.stop) {
    DeviceEventPtr done = copyOut_->record();
    lk.unlock();
    finish(call, aborted(call, core.deviceName));
    return done;
  }
  auto item = std::make_shared<Item>();
  DeviceEventPtr done;
  if (core.broken) {
    // The thread hands it the first cause, in submit order; nothing to queue
    // on the device (the flag is already at its maximum).
    done = copyOut_->record();
  } else {
    try {
      const size_t n = call.chunks.size();
      const auto streams = copyIn_.size();
      item->firstTicket = nextTicket_;
      nextTicket_ += n;
      item->landed.reserve(n);
      std::vector<bool> waitedReady(streams, false);
      for (size_t k = 0; k < n; ++k) {
        const uint64_t ticket = item->firstTicket + k;
        const StagingChunk& chunk = call.chunks[k];
        DeviceStream& in = *copyIn_[ticket % streams];
        if (call.ready && !waitedReady[ticket % streams]) {
          in.wait(call.ready);
          waitedReady[ticket % streams] = true;
        }
        char* slot = nullptr;
        const size_t s = opts_.slots > 0 ? ticket % opts_.slots : 0;
        if (chunk.slotted) {
          slot = static_cast<char*>(core.slotMemory[s].get());
          if (slotFree_[s]) in.wait(slotFree_[s]);
        }
        const auto host = [slot](const StageCopy& c) {
          return slot ? slot + reinterpret_cast<uintptr_t>(c.host) : c.host;
        };
        for (const StageCopy& c : chunk.in) in.copy(host(c), c.device, c.bytes);
        item->landed.push_back(in.record());
        copyOut_->waitHost(*core.flag, ticket);
        // Implied by the flag while all goes well. After a failure the flag
        // is at its maximum, and this keeps the copies out from racing the
        // chunk's copies in, which still run, on the same memory.
        copyOut_->wait(item->landed.back());
        for (const StageCopy& c : chunk.out) copyOut_->copy(c.device, host(c), c.bytes);
        if (chunk.slotted) slotFree_[s] = copyOut_->record();
      }
      if (n == 0 && call.ready) copyOut_->wait(call.ready);
      done = copyOut_->record();
    } catch (...) {
      // Tickets are taken: the flag must pass them or the return stream
      // waits forever.
      lk.unlock();
      fail(core, std::current_exception());
      throw;
    }
  }
  item->call = std::move(call);
  core.queue.push_back(std::move(item));
  lk.unlock();
  core.cv.notify_all();
  return done;
}

void StagingPipeline::shutdown() {
  Core& core = *core_;
  {
    std::lock_guard<std::mutex> lk(core.mu);
    if (core.stop) return;
    core.stop = true;
    core.stopping.store(true);
  }
  core.cv.notify_all();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // from a done() callback: the thread returns after it
    } else {
      std::unique_lock<std::mutex> lk(core.mu);
      const bool exited =
          core.cv.wait_for(lk, std::chrono::milliseconds(500), [&] { return core.exited; });
      lk.unlock();
      if (exited) {
        thread_.join();
      } else {
        SMDDP_LOG(kWarn) << "smddp: staging pipeline of device " << core.deviceName
                         << ": host work still running 500 ms after shutdown; leaving it behind";
        thread_.detach();
      }
    }
  }
  // Only now: copies out released while host work still runs would read
  // its slot as it is written (what a thread left behind cannot avoid).
  core.flag->raise(kFlagMax);
  // The thread takes a call off the queue, under the mutex, only when it
  // has not seen stop; what is left here is ours to finish.
  std::deque<std::shared_ptr<Item>> left;
  {
    std::lock_guard<std::mutex> lk(core.mu);
    left.swap(core.queue);
  }
  for (auto& item : left) finish(item->call, aborted(item->call, core.deviceName));
}

std::exception_ptr StagingPipeline::broken() const {
  std::lock_guard<std::mutex> lk(core_->mu);
  return core_->broken;
}

std::exception_ptr StagingPipeline::fail(Core& core, std::exception_ptr cause) {
  {
    std::lock_guard<std::mutex> lk(core.mu);
    if (!core.broken) core.broken = std::move(cause);
    cause = core.broken;
  }
  core.flag->raise(kFlagMax);  // every queued copy drains
  return cause;
}

namespace {

// Waits for a chunk's copies in: spins and yields first (a chunk often
// lands while the previous one's host work runs), then naps growing to
// 200 us, so stop is seen within well under a millisecond. False on stop.
bool awaitLanded(DeviceEvent& landed, const std::atomic<bool>& stopping,
                 std::chrono::milliseconds timeout, const std::function<std::string()>& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::microseconds(1);
  for (int tries = 0; !landed.query(); ++tries) {
    if (stopping.load(std::memory_order_relaxed)) return false;
    if (std::chrono::steady_clock::now() > deadline) throwError(ErrorKind::kTimeout, what());
    if (tries < 32) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace

void StagingPipeline::run(std::shared_ptr<Core> core) {
  Core& c = *core;
  const size_t slots = c.slotMemory.size();
  for (;;) {
    std::shared_ptr<Item> item;
    std::exception_ptr cause;
    {
      std::unique_lock<std::mutex> lk(c.mu);
      c.cv.wait(lk, [&] { return c.stop || !c.queue.empty(); });
      if (c.stop) break;
      item = c.queue.front();
      cause = c.broken;
    }
    StagingCall& call = item->call;
    bool stopped = false;
    for (size_t k = 0; !cause && k < call.chunks.size(); ++k) {
      const uint64_t ticket = item->firstTicket + k;
      StagingChunk& chunk = call.chunks[k];
      try {
        const auto what = [&] {
          return "smddp: " + call.what + ": the copies in of chunk " + std::to_string(k) +
                 " (of " + std::to_string(call.chunks.size()) + ") did not land on device " +
                 c.deviceName + " within " + std::to_string(c.timeout.count()) + " ms";
        };
        if (!awaitLanded(*item->landed[k], c.stopping, c.timeout, what)) {
          stopped = true;
          break;
        }
        if (chunk.host) chunk.host(chunk.slotted ? c.slotMemory[ticket % slots].get() : nullptr);
      } catch (...) {
        cause = fail(c, std::current_exception());
        break;
      }
      c.flag->raise(ticket);
    }
    if (stopped) break;
    {
      std::lock_guard<std::mutex> lk(c.mu);
      if (c.stop) break;  // shutdown() finishes the call
      c.queue.pop_front();
    }
    finish(call, cause);
  }
  {
    std::lock_guard<std::mutex> lk(c.mu);
    c.exited = true;
  }
  c.cv.notify_all();
}

}  // namespace smddp
