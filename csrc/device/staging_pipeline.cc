#include "device/staging_pipeline.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/error.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "device/reaper.h"

namespace smddp {

namespace {

// A call's done(), run once: by the pipeline thread, or by a shutdown that
// left the thread behind in host work that does not return.
struct OnceDone {
  explicit OnceDone(std::function<void(std::exception_ptr, DeviceEventPtr)> f) : done(std::move(f)) {}
  void fire(std::exception_ptr e, DeviceEventPtr ev) {
    if (!fired.exchange(true) && done) done(std::move(e), std::move(ev));
  }
  std::atomic<bool> fired{false};
  std::function<void(std::exception_ptr, DeviceEventPtr)> done;
};

}  // namespace

struct StagingPipeline::Core {
  std::shared_ptr<Device> device;
  StagingOptions opts;
  std::vector<std::shared_ptr<void>> slotMemory;  // pipeline thread only, once started
  std::atomic<bool> stopping{false};  // `stop`, for the polling loop without the mutex

  std::mutex mu;
  std::condition_variable cv;
  std::deque<StagingCall> queue;  // calls not yet done, in submit order; guarded by mu
  std::exception_ptr broken;      // guarded by mu
  std::shared_ptr<OnceDone> current;  // the call the thread works on; guarded by mu
  std::string currentWhat;            // guarded by mu
  bool stop = false;              // guarded by mu
  bool exited = false;            // the thread has returned; guarded by mu
};

namespace {

std::exception_ptr aborted(const StagingCall& call, const std::string& device) {
  return std::make_exception_ptr(Error(
      ErrorKind::kAborted, "smddp: " + call.what + ": the staging pipeline of device " + device +
                               " was shut down"));
}

// done() belongs to the caller; an exception from it must not take the
// pipeline thread down with it.
void finish(StagingCall& call, std::exception_ptr cause, DeviceEventPtr event) {
  if (!call.done) return;
  try {
    call.done(std::move(cause), std::move(event));
  } catch (const std::exception& e) {
    SMDDP_LOG(kError) << "smddp: " << call.what << ": completion callback threw: " << e.what();
  } catch (...) {
    SMDDP_LOG(kError) << "smddp: " << call.what << ": completion callback threw";
  }
}

// How often the watch runs while copies in are awaited.
constexpr auto kWatchEvery = std::chrono::milliseconds(2);

// Waits for a chunk's copies in: spins and yields first (a chunk often
// lands while the previous one's host work runs), then naps growing to
// 200 us, so stop is seen within well under a millisecond; `watch` runs
// every kWatchEvery meanwhile. False on stop.
bool awaitLanded(DeviceEvent& landed, const std::atomic<bool>& stopping,
                 std::chrono::milliseconds timeout, const std::function<std::string()>& late,
                 const std::function<void(const std::string&)>& watch, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  auto nextWatch = start + kWatchEvery;
  auto nap = std::chrono::microseconds(1);
  for (int tries = 0; !landed.query(); ++tries) {
    if (stopping.load(std::memory_order_relaxed)) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) throwError(ErrorKind::kTimeout, late());
    if (watch && now >= nextWatch) {
      watch(what);
      nextWatch = now + kWatchEvery;
    }
    if (tries < 32) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(200));
  }
  return true;
}

void checkFitsSlots(const StagingCall& call, const StagingOptions& opts) {
  for (size_t k = 0; k < call.chunks.size(); ++k) {
    const StagingChunk& chunk = call.chunks[k];
    if (!chunk.slotted) continue;
    for (const auto* copies : {&chunk.in, &chunk.out}) {
      for (const StageCopy& c : *copies) {
        const auto offset = reinterpret_cast<uintptr_t>(c.host);
        if (opts.slots > 0 && offset <= opts.slotBytes && c.bytes <= opts.slotBytes - offset) {
          continue;
        }
        throwError(ErrorKind::kInvalidArgument,
                   "smddp: " + call.what + ": chunk " + std::to_string(k) + " stages " +
                       std::to_string(c.bytes) + " bytes at offset " + std::to_string(offset) +
                       " of a staging slot of " + std::to_string(opts.slotBytes) + " bytes (" +
                       std::to_string(opts.slots) + " slots)");
      }
    }
  }
}

}  // namespace

// The pipeline thread's side: one call at a time, its copies in queued at
// most `slots` chunks ahead of its host work.
class StagingPipeline::Runner {
 public:
  explicit Runner(Core& core)
      : c_(core),
        in_(core.device->poolStream(core.opts.inStream)),
        out_(core.device->poolStream(core.opts.outStream)),
        slotFree_(core.slotMemory.size()) {}

  // Runs `call`'s chunks; returns false when stop came first. On success
  // `event` completes after its last copy back; on failure `cause` is set.
  bool process(StagingCall& call, std::exception_ptr& cause, DeviceEventPtr& event) {
    for (auto& e : landed_) hold(std::move(e));
    landed_.clear();
    slotOf_.clear();
    nextIn_ = 0;
    const size_t n = call.chunks.size();
    const size_t ahead = std::max<size_t>(1, c_.slotMemory.size());
    try {
      queueInUpTo(call, std::min(n, ahead));
      for (size_t k = 0; k < n; ++k) {
        if (!awaitLanded(*landed_[k], c_.stopping, c_.opts.timeout, [&] { return late(call, k); },
                         c_.opts.watch, call.what)) {
          drain(call);
          return false;
        }
        StagingChunk& chunk = call.chunks[k];
        if (chunk.host) chunk.host(slotBase(k));
        queueOut(call, k);
        queueInUpTo(call, std::min(n, k + 1 + ahead));
      }
      if (n == 0 && call.ready) out_.wait(call.ready);
      event = out_.record();
      DeviceReaper::of(c_.device).release(event, std::move(call.keep));
      hold(std::move(call.ready));
    } catch (...) {
      cause = std::current_exception();
      if (c_.opts.onBroken) {
        try {
          c_.opts.onBroken(cause);
        } catch (const std::exception& e) {
          SMDDP_LOG(kError) << "smddp: " << call.what << ": ending the failed call's device work: "
                            << e.what();
        }
      }
      drain(call);
    }
    return true;
  }

  // Events are kept until they complete (destroying one with its work
  // pending is an error on the stand-in, as a freed tensor would be).
  ~Runner() {
    for (auto& e : landed_) hold(std::move(e));
    for (auto& e : slotFree_) hold(std::move(e));
  }

  // Everything queued so far has run once this completes: what memory the
  // device may still use waits for it.
  DeviceEventPtr drainEvent() {
    DeviceEventPtr in = in_.record();
    out_.wait(in);
    hold(std::move(in));
    return out_.record();
  }

  void hold(DeviceEventPtr e) {
    if (e) DeviceReaper::of(c_.device).release(std::move(e), nullptr);
  }

 private:
  std::string late(const StagingCall& call, size_t k) const {
    return "smddp: " + call.what + ": the copies in of chunk " + std::to_string(k) + " (of " +
           std::to_string(call.chunks.size()) + ") did not land on device " +
           c_.device->name() + " within " + std::to_string(c_.opts.timeout.count()) + " ms";
  }

  void* slotBase(size_t k) const {
    return slotOf_[k] >= 0 ? c_.slotMemory[static_cast<size_t>(slotOf_[k])].get() : nullptr;
  }
  void* hostOf(size_t k, const StageCopy& copy) const {
    auto* base = static_cast<char*>(slotBase(k));
    return base ? base + reinterpret_cast<uintptr_t>(copy.host) : copy.host;
  }

  void queueInUpTo(StagingCall& call, size_t end) {
    for (; nextIn_ < end; ++nextIn_) {
      const size_t k = nextIn_;
      const StagingChunk& chunk = call.chunks[k];
      if (k == 0 && call.ready) in_.wait(call.ready);
      int slot = -1;
      if (chunk.slotted) {
        slot = static_cast<int>(nextSlot_++ % c_.slotMemory.size());
        // The slot's previous chunk has had its copies out queued (copies
        // in run at most `slots` ahead); they must finish first.
        if (slotFree_[slot]) in_.wait(slotFree_[slot]);
      }
      slotOf_.push_back(slot);
      if (chunk.beforeIn) chunk.beforeIn(in_, slot, slotBase(k), call.ready);
      for (const StageCopy& cp : chunk.in) in_.copy(hostOf(k, cp), cp.device, cp.bytes);
      landed_.push_back(in_.record());
    }
  }

  void queueOut(StagingCall& call, size_t k) {
    const StagingChunk& chunk = call.chunks[k];
    // In order behind this chunk's copies in, which wrote the same memory.
    out_.wait(landed_[k]);
    for (const StageCopy& cp : chunk.out) out_.copy(cp.device, hostOf(k, cp), cp.bytes);
    if (chunk.afterOut) chunk.afterOut(out_, slotOf_[k], slotBase(k));
    if (slotOf_[k] >= 0) {
      auto& free = slotFree_[static_cast<size_t>(slotOf_[k])];
      hold(std::move(free));
      free = out_.record();
    }
  }

  // After a failure or a stop, copies in already queued still run: the
  // slots are free again only after them, and the call's memory goes to
  // the reaper until then.
  void drain(StagingCall& call) {
    try {
      DeviceEventPtr after = drainEvent();
      for (auto& f : slotFree_) {
        hold(std::move(f));
        f = after;
      }
      DeviceReaper::of(c_.device).release(after, std::move(call.keep));
      hold(std::move(call.ready));
    } catch (const std::exception& e) {
      SMDDP_LOG(kError) << "smddp: " << call.what << ": " << e.what();
      DeviceReaper::keepForever(std::move(call.keep));  // the device failed
    }
  }

  Core& c_;
  DeviceStream& in_;
  DeviceStream& out_;
  std::vector<DeviceEventPtr> slotFree_;  // the last copy out from each slot
  uint64_t nextSlot_ = 0;
  size_t nextIn_ = 0;
  std::vector<DeviceEventPtr> landed_;  // per chunk of the current call
  std::vector<int> slotOf_;             // per chunk: its slot, or -1
};

StagingPipeline::StagingPipeline(std::shared_ptr<Device> device, StagingOptions opts)
    : device_(std::move(device)), opts_(opts), core_(std::make_shared<Core>()) {
  SMDDP_CHECK(device_ != nullptr, kInvalidArgument, "smddp: staging pipeline without a device");
  SMDDP_CHECK(opts_.slots >= 0 && opts_.timeout.count() > 0 && opts_.inStream >= 0 &&
                  opts_.inStream < Device::kPoolStreams && opts_.outStream >= 0 &&
                  opts_.outStream < Device::kPoolStreams,
              kInvalidArgument,
              "smddp: staging pipeline options: slots " + std::to_string(opts_.slots) +
                  " (needs >= 0), timeout " + std::to_string(opts_.timeout.count()) +
                  " ms (needs > 0), streams " + std::to_string(opts_.inStream) + " and " +
                  std::to_string(opts_.outStream) + " (pool streams 0.." +
                  std::to_string(Device::kPoolStreams - 1) + ")");
  core_->device = device_;
  core_->opts = opts_;
  for (int i = 0; i < opts_.slots; ++i) core_->slotMemory.push_back(device_->allocHost(opts_.slotBytes));
  thread_ = std::thread(run, core_);
}

StagingPipeline::~StagingPipeline() { shutdown(); }

void StagingPipeline::submit(StagingCall call) {
  // Checked before anything is queued: a refused call leaves no trace.
  checkFitsSlots(call, opts_);
  Core& core = *core_;
  std::unique_lock<std::mutex> lk(core.mu);
  if (core.stop) {
    lk.unlock();
    DeviceReaper::of(device_).release(std::move(call.ready), nullptr);
    finish(call, aborted(call, device_->name()), nullptr);
    return;
  }
  core.queue.push_back(std::move(call));
  lk.unlock();
  core.cv.notify_all();
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
        SMDDP_LOG(kWarn) << "smddp: staging pipeline of device " << device_->name()
                         << ": host work still running 500 ms after shutdown; leaving it behind";
        thread_.detach();
        std::shared_ptr<OnceDone> current;
        StagingCall what;
        {
          std::lock_guard<std::mutex> lk(core.mu);
          current = core.current;
          what.what = core.currentWhat;
        }
        if (current) current->fire(aborted(what, device_->name()), nullptr);
      }
    }
  }
  // The thread takes a call off the queue, under the mutex, only when it
  // has not seen stop; what is left here is ours to finish. Such calls
  // never reached the device.
  std::deque<StagingCall> left;
  {
    std::lock_guard<std::mutex> lk(core.mu);
    left.swap(core.queue);
  }
  for (auto& call : left) {
    DeviceReaper::of(device_).release(std::move(call.ready), nullptr);
    finish(call, aborted(call, device_->name()), nullptr);
  }
}

std::exception_ptr StagingPipeline::broken() const {
  std::lock_guard<std::mutex> lk(core_->mu);
  return core_->broken;
}

void StagingPipeline::run(std::shared_ptr<Core> core) {
  smddp::nameThisThread("smddp-staging");
  Core& c = *core;
  std::exception_ptr bindFailed;
  try {
    c.device->bindThread();
  } catch (...) {
    bindFailed = std::current_exception();
  }
  std::unique_ptr<Runner> runner;
  if (!bindFailed) runner = std::make_unique<Runner>(c);
  for (;;) {
    StagingCall call;
    std::exception_ptr cause;
    {
      std::unique_lock<std::mutex> lk(c.mu);
      c.cv.wait(lk, [&] { return c.stop || !c.queue.empty(); });
      if (c.stop) break;
      call = std::move(c.queue.front());
      c.queue.pop_front();
      if (!c.broken && bindFailed) c.broken = bindFailed;
      cause = c.broken;
      auto once = std::make_shared<OnceDone>(std::move(call.done));
      call.done = [once](std::exception_ptr e, DeviceEventPtr ev) { once->fire(std::move(e), std::move(ev)); };
      c.current = once;
      c.currentWhat = call.what;
    }
    DeviceEventPtr event;
    if (!cause && !runner->process(call, cause, event)) {
      finish(call, aborted(call, c.device->name()), nullptr);
      DeviceReaper::of(c.device).release(std::move(call.ready), nullptr);
      break;
    }
    if (cause) {
      std::lock_guard<std::mutex> lk(c.mu);
      if (!c.broken) c.broken = cause;
      cause = c.broken;
    }
    finish(call, cause, cause ? nullptr : event);
    // A call refused without touching the device leaves its readiness
    // event, which may still be pending.
    DeviceReaper::of(c.device).release(std::move(call.ready), nullptr);
    std::lock_guard<std::mutex> lk(c.mu);
    c.current.reset();
  }
  // The slots go once every copy queued so far has run.
  if (runner) {
    try {
      DeviceEventPtr after = runner->drainEvent();
      for (auto& m : c.slotMemory) DeviceReaper::of(c.device).release(after, std::move(m));
      DeviceReaper::of(c.device).release(std::move(after), nullptr);
    } catch (const std::exception& e) {
      SMDDP_LOG(kWarn) << "smddp: staging pipeline of device " << c.device->name() << ": " << e.what()
                       << "; its staging memory is kept for good";
      for (auto& m : c.slotMemory) DeviceReaper::keepForever(std::move(m));
    }
  }
  {
    std::lock_guard<std::mutex> lk(c.mu);
    c.exited = true;
  }
  c.cv.notify_all();
}

}  // namespace smddp
