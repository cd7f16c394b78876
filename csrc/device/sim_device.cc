#include "device/sim_device.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <random>
#include <thread>

namespace smddp {

namespace {

// One mutex and condition variable per device: an event's completion, a
// flag's raise, a queued operation and a stream's destruction all notify it,
// so every wait of every stream wakes on whatever it waits for, and on its
// stream's destruction.
struct SimCore {
  std::mutex mu;
  std::condition_variable cv;
  SimDeviceOptions opts;
  int64_t copies = 0;  // queued so far over all streams, for hangCopy; guarded by mu
  int streams = 0;     // created so far, to seed each stream's delays; guarded by mu
};

class SimEvent : public DeviceEvent {
 public:
  bool query() override { return done.load(std::memory_order_acquire); }
  std::atomic<bool> done{false};
};

class SimFlag : public HostFlag, public std::enable_shared_from_this<SimFlag> {
 public:
  explicit SimFlag(std::shared_ptr<SimCore> core) : core_(std::move(core)) {}
  void raise(uint64_t value) override {
    {
      std::lock_guard<std::mutex> lk(core_->mu);
      if (value <= value_.load(std::memory_order_relaxed)) return;
      value_.store(value, std::memory_order_release);
    }
    core_->cv.notify_all();
  }
  uint64_t value() const override { return value_.load(std::memory_order_acquire); }

 private:
  std::shared_ptr<SimCore> core_;
  std::atomic<uint64_t> value_{0};
};

class SimStream : public DeviceStream {
 public:
  explicit SimStream(std::shared_ptr<SimCore> core) : core_(std::move(core)) {
    std::lock_guard<std::mutex> lk(core_->mu);
    rng_.seed(core_->opts.seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(core_->streams++));
    thread_ = std::thread([this] { run(); });
  }
  ~SimStream() override {
    {
      std::lock_guard<std::mutex> lk(core_->mu);
      stop_ = true;
    }
    core_->cv.notify_all();
    thread_.join();
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    Op op;
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    std::lock_guard<std::mutex> lk(core_->mu);
    op.hang = core_->copies++ == core_->opts.hangCopy;
    push(std::move(op));
  }
  DeviceEventPtr record() override {
    Op op;
    op.event = std::make_shared<SimEvent>();
    DeviceEventPtr event = op.event;
    std::lock_guard<std::mutex> lk(core_->mu);
    push(std::move(op));
    return event;
  }
  void wait(const DeviceEventPtr& event) override {
    Op op;
    op.ready = [event] { return event->query(); };
    std::lock_guard<std::mutex> lk(core_->mu);
    push(std::move(op));
  }
  void waitHost(const HostFlag& flag, uint64_t value) override {
    Op op;
    // Keeps a flag of this device alive while the operation is queued; the
    // caller keeps any other flag alive.
    if (auto* sim = dynamic_cast<const SimFlag*>(&flag)) {
      op.ready = [f = sim->shared_from_this(), value] { return f->value() >= value; };
    } else {
      op.ready = [&flag, value] { return flag.value() >= value; };
    }
    std::lock_guard<std::mutex> lk(core_->mu);
    push(std::move(op));
  }

 private:
  // A copy (bytes, dst, src), a record (event) or a wait (ready).
  struct Op {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    bool hang = false;
    std::shared_ptr<SimEvent> event;
    std::function<bool()> ready;
  };

  void push(Op op) {  // core_->mu held
    ops_.push_back(std::move(op));
    core_->cv.notify_all();
  }

  void run() {
    const auto maxDelay = core_->opts.maxDelay.count();
    std::uniform_int_distribution<int64_t> delay(0, maxDelay > 0 ? maxDelay : 0);
    std::unique_lock<std::mutex> lk(core_->mu);
    const auto stopped = [this] { return stop_; };
    for (;;) {
      core_->cv.wait(lk, [this] { return stop_ || !ops_.empty(); });
      if (stop_) return;
      Op op = std::move(ops_.front());
      ops_.pop_front();
      if (maxDelay > 0 &&
          core_->cv.wait_for(lk, std::chrono::microseconds(delay(rng_)), stopped)) {
        return;
      }
      if (op.event) {
        op.event->done.store(true, std::memory_order_release);
        core_->cv.notify_all();
      } else if (op.ready) {
        // Events and flags of this device notify the condition variable;
        // the 1 ms bound covers those of another device.
        while (!stop_ && !op.ready()) core_->cv.wait_for(lk, std::chrono::milliseconds(1));
        if (stop_) return;
      } else if (op.hang) {
        core_->cv.wait(lk, stopped);
        return;
      } else {
        lk.unlock();
        std::memcpy(op.dst, op.src, op.bytes);
        if (core_->opts.afterCopy) core_->opts.afterCopy(op.dst, op.src, op.bytes);
        lk.lock();
      }
    }
  }

  std::shared_ptr<SimCore> core_;
  std::mt19937_64 rng_;             // only the stream's thread draws after construction
  std::deque<Op> ops_;              // guarded by core_->mu
  bool stop_ = false;               // guarded by core_->mu
  std::thread thread_;
};

class SimDevice : public Device {
 public:
  explicit SimDevice(SimDeviceOptions opts) : core_(std::make_shared<SimCore>()) {
    core_->opts = std::move(opts);
  }
  std::string name() const override { return "sim"; }
  std::unique_ptr<DeviceStream> newStream() override { return std::make_unique<SimStream>(core_); }
  std::shared_ptr<HostFlag> newHostFlag() override { return std::make_shared<SimFlag>(core_); }
  std::shared_ptr<void> allocHost(size_t bytes) override {
    // aligned_alloc wants a multiple of the alignment, and never zero.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded > 0 ? rounded : 64);
    if (!p) throw std::bad_alloc();
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }

 private:
  std::shared_ptr<SimCore> core_;
};

}  // namespace

std::shared_ptr<Device> makeSimDevice(SimDeviceOptions opts) {
  return std::make_shared<SimDevice>(std::move(opts));
}

}  // namespace smddp
