#include "device/sim_device.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/error.h"
#include "common/thread_name.h"
#include "device/sim_rules.h"

namespace smddp {

using namespace sim_rules;

namespace {

// ---- the process's devices (SMDDP_DEVICE_SIM) ------------------------------

struct Registry {
  std::mutex mu;
  SimDeviceOptions defaults;                       // guarded by mu
  std::map<int, std::shared_ptr<Device>> devices;  // guarded by mu
};

Registry& registry() {
  // Never destroyed: queue threads of process-wide devices run until exit.
  static Registry* r = std::make_unique<Registry>().release();
  return *r;
}

thread_local int tDevice = 0;         // this thread's current device
thread_local bool tRelaxed = false;   // relaxed capture mode (Device::bindThread)

// ---- one device -------------------------------------------------------------

struct EventState {
  std::atomic<bool> done{false};
};

struct StreamState {
  int id = 0;
  std::chrono::microseconds extraDelay{0};  // SimDeviceOptions::slowPool
  size_t queue = 0;
  std::atomic<int64_t> pending{0};
  bool capturing = false;                           // guarded by the core's mu
  std::vector<std::function<bool()>> recordedBy;    // guarded by the core's mu
};

struct Op {
  enum Kind { kCopy, kRecord, kWait, kFill, kHost } kind = kCopy;
  std::shared_ptr<StreamState> stream;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  bool hang = false;
  std::vector<uint8_t> pattern;
  std::shared_ptr<EventState> event;
  std::function<void()> body;
  std::shared_ptr<std::atomic<bool>> ran;  // CUDA_LAUNCH_BLOCKING: the pusher waits for it
};

class SimStream;

struct SimCore {
  SimDeviceOptions opts;
  std::string name;
  std::mutex mu;
  std::condition_variable cv;
  struct Queue {
    std::deque<Op> ops;  // guarded by mu
    std::thread thread;
  };
  std::vector<Queue> queues;
  bool stopped = false;     // guarded by mu
  int64_t copies = 0;       // guarded by mu: queued so far, for hangCopy
  int streams = 0;          // guarded by mu: created so far
  int capturing = 0;        // guarded by mu: streams now capturing
  std::vector<std::shared_ptr<StreamState>> all;  // guarded by mu: every live stream's state

  void checkBound(const char* what) const {
    if (tDevice != opts.index) {
      violate("thread " + threadName() + " " + what + " on " + name +
              " while its current device is sim:" + std::to_string(tDevice) +
              " (bind the thread, or guard the call, first)");
    }
  }
  void checkMayQuery(const char* what) {
    std::lock_guard<std::mutex> lk(mu);
    if (capturing > 0 && !tRelaxed) {
      violate(std::string(what) + " on " + name +
              " while a stream captures a graph (global capture mode), from thread " +
              threadName());
    }
  }

  void push(Op op) {
    checkBound("queued work");
    noteContext(opts.index);
    std::shared_ptr<std::atomic<bool>> ran;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (op.kind == Op::kCopy) op.hang = copies++ == opts.hangCopy;
      if (opts.launchBlocking) op.ran = ran = std::make_shared<std::atomic<bool>>(false);
      op.stream->pending.fetch_add(1);
      queues[op.stream->queue].ops.push_back(std::move(op));
    }
    cv.notify_all();
    if (!ran) return;
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return stopped || ran->load(); });
  }

  void run(size_t q, uint64_t seed);
  void execute(Op& op, std::unique_lock<std::mutex>& lk);
};

void SimCore::run(size_t q, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto maxDelay = opts.maxDelay.count();
  std::uniform_int_distribution<int64_t> delay(0, maxDelay > 0 ? maxDelay : 0);
  std::unique_lock<std::mutex> lk(mu);
  const auto stop = [this] { return stopped; };
  for (;;) {
    cv.wait(lk, [&] { return stopped || !queues[q].ops.empty(); });
    if (stopped) return;
    const auto extra = queues[q].ops.front().stream->extraDelay;
    if (maxDelay > 0 && cv.wait_for(lk, std::chrono::microseconds(delay(rng)), stop)) return;
    if (extra.count() > 0 && cv.wait_for(lk, extra, stop)) return;
    // Taken only now: a wait at the head holds back the whole queue.
    Op& head = queues[q].ops.front();
    execute(head, lk);
    if (stopped) return;
    Op op = std::move(queues[q].ops.front());
    queues[q].ops.pop_front();
    op.stream->pending.fetch_sub(1);
    if (op.ran) op.ran->store(true);
    cv.notify_all();
  }
}

void SimCore::execute(Op& op, std::unique_lock<std::mutex>& lk) {
  switch (op.kind) {
    case Op::kRecord:
      op.event->done.store(true, std::memory_order_release);
      return;
    case Op::kWait:
      // Events of other devices do not notify this one: poll them.
      while (!stopped && !op.event->done.load(std::memory_order_acquire)) {
        cv.wait_for(lk, std::chrono::milliseconds(1));
      }
      return;
    case Op::kCopy:
      if (op.hang) {
        cv.wait(lk, [this] { return stopped; });
        return;
      }
      break;
    case Op::kFill:
    case Op::kHost:
      break;
  }
  lk.unlock();
  if (op.kind == Op::kCopy) {
    const auto dst = reinterpret_cast<uintptr_t>(op.dst), src = reinterpret_cast<uintptr_t>(op.src);
    if (quarantined(dst, op.bytes) || quarantined(src, op.bytes)) {
      noteViolation("a copy of " + std::to_string(op.bytes) + " bytes on " + name +
                    " used page-locked memory that was already freed");
    } else {
      std::memcpy(op.dst, op.src, op.bytes);
      if (opts.afterCopy) opts.afterCopy(op.dst, op.src, op.bytes);
    }
    noteCopy(src, op.bytes);
  } else if (op.kind == Op::kFill) {
    auto* d = static_cast<uint8_t*>(op.dst);
    const size_t n = op.pattern.size();
    for (size_t i = 0; n > 0 && i + n <= op.bytes; i += n) std::memcpy(d + i, op.pattern.data(), n);
  } else {
    try {
      op.body();
    } catch (const std::exception& e) {
      noteViolation(std::string("a host kernel on ") + name + " threw: " + e.what());
    }
  }
  lk.lock();
}

class SimEvent : public DeviceEvent {
 public:
  SimEvent(std::shared_ptr<SimCore> core, std::shared_ptr<EventState> state)
      : core_(std::move(core)), state_(std::move(state)) {}
  ~SimEvent() override {
    // cudaEventDestroy is a CUDA call like any other: the calling thread's
    // current device gets a context (and torch's destroyEvent ends by
    // setting the thread's device back), so a thread that never bound
    // itself to the event's device makes one on device 0.
    noteContext(tDevice);
    if (state_->done.load()) return;
    std::lock_guard<std::mutex> lk(core_->mu);
    if (!core_->stopped) {
      // Kept, not thrown: destructors must not throw.
      keepViolation("an event of " + core_->name + " was destroyed with its work still pending");
    }
  }
  bool query() override {
    core_->checkMayQuery("an event query");
    return state_->done.load(std::memory_order_acquire);
  }
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<SimCore> core_;
  std::shared_ptr<EventState> state_;
};

class SimStream : public DeviceStream {
 public:
  explicit SimStream(std::shared_ptr<SimCore> core) : core_(std::move(core)) {
    state_ = std::make_shared<StreamState>();
    std::lock_guard<std::mutex> lk(core_->mu);
    state_->id = core_->streams++;
    state_->queue = static_cast<size_t>(state_->id) % core_->queues.size();
    core_->all.push_back(state_);
  }
  ~SimStream() override {
    std::string broken;
    {
      std::lock_guard<std::mutex> lk(core_->mu);
      auto& all = core_->all;
      all.erase(std::remove(all.begin(), all.end(), state_), all.end());
      if (core_->stopped) return;
      if (state_->pending.load() > 0) {
        broken = "a stream of " + core_->name + " was destroyed with " +
                 std::to_string(state_->pending.load()) + " operations pending";
      }
      for (const auto& referenced : state_->recordedBy) {
        if (referenced()) {
          broken = "a stream of " + core_->name +
                   " was destroyed while a live tensor's recordStream still refers to it";
        }
      }
    }
    if (!broken.empty()) keepViolation(broken);
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Op op;
    op.kind = Op::kCopy;
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    push(std::move(op));
  }
  DeviceEventPtr record() override {
    Op op;
    op.kind = Op::kRecord;
    op.event = std::make_shared<EventState>();
    auto event = std::make_shared<SimEvent>(core_, op.event);
    push(std::move(op));
    return event;
  }
  void wait(const DeviceEventPtr& event) override {
    if (!event) return;
    auto* sim = dynamic_cast<SimEvent*>(event.get());
    SMDDP_CHECK(sim, kInternal, core_->name + ": a stream was asked to wait for an event of another kind");
    Op op;
    op.kind = Op::kWait;
    op.event = sim->state();
    push(std::move(op));
  }

  void push(Op op) {
    op.stream = state_;
    core_->push(std::move(op));
  }
  const std::shared_ptr<StreamState>& state() const { return state_; }
  SimCore& core() { return *core_; }

 private:
  std::shared_ptr<SimCore> core_;
  std::shared_ptr<StreamState> state_;
};

class SimDevice : public Device {
 public:
  explicit SimDevice(SimDeviceOptions opts) : core_(std::make_shared<SimCore>()) {
    SMDDP_CHECK(opts.queues >= 1, kInvalidArgument,
                "smddp: a simulated device needs at least 1 hardware queue, got " +
                    std::to_string(opts.queues));
    core_->opts = std::move(opts);
    core_->name = "sim:" + std::to_string(core_->opts.index);
    core_->queues = std::vector<SimCore::Queue>(static_cast<size_t>(core_->opts.queues));
    for (size_t q = 0; q < core_->queues.size(); ++q) {
      const uint64_t seed = core_->opts.seed + 0x9e3779b97f4a7c15ull * (q + 1);
      core_->queues[q].thread = std::thread([core = core_.get(), q, seed] {
        smddp::nameThisThread("sim-stream");
        core->run(q, seed);
      });
    }
    defaultStream_ = std::make_unique<SimStream>(core_);
    for (int i = 0; i < kPoolStreams; ++i) {
      pool_[i] = std::make_unique<SimStream>(core_);
      if (i == core_->opts.slowPool) pool_[i]->state()->extraDelay = core_->opts.slowDelay;
    }
  }
  ~SimDevice() override {
    {
      std::lock_guard<std::mutex> lk(core_->mu);
      core_->stopped = true;
    }
    core_->cv.notify_all();
    for (auto& q : core_->queues) q.thread.join();
  }

  std::string name() const override { return core_->name; }
  int index() const override { return core_->opts.index; }
  void bindThread() override {
    sim::setDevice(core_->opts.index);
    tRelaxed = true;
  }
  DeviceStream& poolStream(int which) override {
    SMDDP_CHECK(which >= 0 && which < kPoolStreams, kInvalidArgument,
                core_->name + ": no pool stream " + std::to_string(which));
    return *pool_[which];
  }
  std::unique_ptr<DeviceStream> newStream() override {
    core_->checkBound("made a stream");
    return std::make_unique<SimStream>(core_);
  }
  std::shared_ptr<void> allocHost(size_t bytes) override {
    core_->checkBound("allocated page-locked memory");
    noteContext(core_->opts.index);
    const size_t rounded = std::max<size_t>((bytes + 63) / 64 * 64, 64);
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    std::shared_ptr<void> mem(p, [](void* q) { std::free(q); });
    // The user's handle: when it goes, the memory moves to the quarantine.
    return std::shared_ptr<void>(
        p, [mem, rounded](void*) mutable { quarantine(std::move(mem), rounded); });
  }

  SimCore& core() { return *core_; }
  const std::shared_ptr<SimCore>& sharedCore() const { return core_; }
  SimStream& defaultStream() { return *defaultStream_; }

 private:
  std::shared_ptr<SimCore> core_;
  std::unique_ptr<SimStream> defaultStream_;
  std::unique_ptr<SimStream> pool_[kPoolStreams];
};

SimDevice& simOf(Device& device) {
  auto* sim = dynamic_cast<SimDevice*>(&device);
  SMDDP_CHECK(sim, kInvalidArgument, device.name() + " is not a simulated device");
  return *sim;
}

SimStream& simOf(DeviceStream& stream) {
  auto* sim = dynamic_cast<SimStream*>(&stream);
  SMDDP_CHECK(sim, kInvalidArgument, "not a stream of a simulated device");
  return *sim;
}

// This thread's current stream per device (null: the default stream), and
// the streams its captures run on.
thread_local std::unordered_map<const SimCore*, DeviceStream*> tStreams;
thread_local std::vector<std::pair<std::unique_ptr<DeviceStream>, DeviceStream*>> tCaptures;

}  // namespace

std::shared_ptr<Device> makeSimDevice(SimDeviceOptions opts) {
  return std::make_shared<SimDevice>(std::move(opts));
}

namespace sim {

void setDefaults(SimDeviceOptions opts) {
  std::lock_guard<std::mutex> lk(registry().mu);
  registry().defaults = std::move(opts);
}

std::shared_ptr<Device> deviceAt(int index) {
  SMDDP_CHECK(index >= 0 && index < 1024, kInvalidArgument,
              "smddp: no simulated device " + std::to_string(index));
  std::lock_guard<std::mutex> lk(registry().mu);
  auto& d = registry().devices[index];
  if (!d) {
    SimDeviceOptions o = registry().defaults;
    o.index = index;
    o.seed += static_cast<uint64_t>(index) * 7919;
    d = makeSimDevice(std::move(o));
  }
  return d;
}

void setDevice(int index) {
  tDevice = index;
  noteContext(index);
}

int currentDevice() { return tDevice; }

int exchangeDevice(int index) {
  const int previous = tDevice;
  if (previous != index) setDevice(index);
  return previous;
}

void maybeSetDevice(int index) {
  if (index == tDevice) return;
  // No context there yet: making one just to restore would put this
  // process on a device it never used (torch's MaybeSetDevice).
  if (hasContext(index)) tDevice = index;
}

DeviceStream& currentStream(Device& device) {
  SimDevice& sim = simOf(device);
  auto it = tStreams.find(&sim.core());
  return it != tStreams.end() && it->second ? *it->second : sim.defaultStream();
}

DeviceStream& defaultStream(Device& device) { return simOf(device).defaultStream(); }

std::unique_ptr<DeviceStream> newStream(Device& device) {
  return std::make_unique<SimStream>(simOf(device).sharedCore());
}

void setCurrentStream(Device& device, DeviceStream* stream) {
  tStreams[&simOf(device).core()] = stream;
}

void beginCapture(Device& device) {
  SimDevice& sim = simOf(device);
  DeviceStream* previous = &currentStream(device);
  auto stream = newStream(device);
  {
    std::lock_guard<std::mutex> lk(sim.core().mu);
    simOf(*stream).state()->capturing = true;
    ++sim.core().capturing;
  }
  setCurrentStream(device, stream.get());
  tCaptures.emplace_back(std::move(stream), previous);
}

void endCapture(Device& device) {
  SimDevice& sim = simOf(device);
  SMDDP_CHECK(!tCaptures.empty(), kInvalidArgument, "smddp: no capture to end on this thread");
  auto [stream, previous] = std::move(tCaptures.back());
  tCaptures.pop_back();
  {
    std::lock_guard<std::mutex> lk(sim.core().mu);
    simOf(*stream).state()->capturing = false;
    --sim.core().capturing;
  }
  setCurrentStream(device, previous == &sim.defaultStream() ? nullptr : previous);
}

bool isCapturing(Device& device, DeviceStream& stream) {
  std::lock_guard<std::mutex> lk(simOf(device).core().mu);
  return simOf(stream).state()->capturing;
}

void hostWait(Device& device, const DeviceEventPtr& event, std::chrono::milliseconds timeout,
              const std::string& what) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!event->query()) {
    SMDDP_CHECK(std::chrono::steady_clock::now() < until, kTimeout,
                "smddp: " + device.name() + ": " + what + " did not complete within " +
                    std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void synchronize(Device& device, std::chrono::milliseconds timeout) {
  SimCore& core = simOf(device).core();
  core.checkMayQuery("a host wait for the device");
  std::unique_lock<std::mutex> lk(core.mu);
  const bool drained = core.cv.wait_for(lk, timeout, [&] {
    if (core.stopped) return true;
    for (const auto& s : core.all) {
      if (s->pending.load() > 0) return false;
    }
    return true;
  });
  SMDDP_CHECK(drained, kTimeout,
              "smddp: " + core.name + ": the device did not drain within " +
                  std::to_string(timeout.count()) + " ms");
}

void fill(DeviceStream& stream, void* dst, size_t bytes, std::vector<uint8_t> pattern) {
  Op op;
  op.kind = Op::kFill;
  op.dst = dst;
  op.bytes = bytes;
  op.pattern = std::move(pattern);
  simOf(stream).push(std::move(op));
}

void hostKernel(DeviceStream& stream, std::function<void()> body) {
  Op op;
  op.kind = Op::kHost;
  op.body = std::move(body);
  simOf(stream).push(std::move(op));
}

void recordStream(DeviceStream& stream, std::function<bool()> referenced) {
  SimStream& s = simOf(stream);
  std::lock_guard<std::mutex> lk(s.core().mu);
  auto& by = s.state()->recordedBy;
  // Entries whose tensor is gone are dropped as new ones come.
  by.erase(std::remove_if(by.begin(), by.end(), [](const auto& r) { return !r(); }), by.end());
  by.push_back(std::move(referenced));
}

int deviceOf(DeviceStream& stream) { return simOf(stream).core().opts.index; }

}  // namespace sim

}  // namespace smddp
