#include "device/reaper.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/thread_name.h"

namespace smddp {

namespace {

class Reaper final : public DeviceReaper {
 public:
  explicit Reaper(std::shared_ptr<Device> device) : device_(std::move(device)) {
    thread_ = std::thread([this] {
      smddp::nameThisThread("smddp-reaper");
      run();
    });
  }
  // Never destroyed (DeviceReaper::of): what waits at exit may still be in
  // use by the device, so it is never freed.
  ~Reaper() override = default;

  void release(DeviceEventPtr after, std::shared_ptr<void> payload) override {
    if (!after) return;  // payload goes now
    std::lock_guard<std::mutex> lk(mu_);
    waiting_.emplace_back(std::move(after), std::move(payload));
    cv_.notify_all();
  }

  size_t pending() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return waiting_.size();
  }

 private:
  void run() {
    try {
      device_->bindThread();
    } catch (const std::exception& e) {
      SMDDP_LOG(kWarn) << "smddp: " << device_->name() << ": the reaper thread could not bind to "
                       << "the device (" << e.what() << "); staging memory is kept for good";
      std::lock_guard<std::mutex> lk(mu_);
      broken_ = true;
    }
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait_for(lk, std::chrono::milliseconds(waiting_.empty() ? 1000 : 1));
      if (broken_ || waiting_.empty()) continue;
      // Query outside the lock: release() must never wait on the device.
      std::vector<std::pair<DeviceEventPtr, std::shared_ptr<void>>> batch;
      batch.swap(waiting_);
      lk.unlock();
      std::vector<std::pair<DeviceEventPtr, std::shared_ptr<void>>> keep;
      bool failed = false;
      for (auto& e : batch) {
        bool done = false;
        if (!failed) {
          try {
            done = e.first->query();
          } catch (const std::exception& ex) {
            SMDDP_LOG(kWarn) << "smddp: " << device_->name() << ": " << ex.what()
                             << "; staging memory it may still use is kept for good";
            failed = true;
          }
        }
        if (!done) keep.push_back(std::move(e));
      }
      batch.clear();  // frees what completed
      lk.lock();
      broken_ = broken_ || failed;
      for (auto& e : keep) waiting_.push_back(std::move(e));
    }
  }

  std::shared_ptr<Device> device_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<DeviceEventPtr, std::shared_ptr<void>>> waiting_;  // guarded by mu_
  bool broken_ = false;  // the device failed: keep everything; guarded by mu_
  std::thread thread_;
};

}  // namespace

void DeviceReaper::keepForever(std::shared_ptr<void> payload) {
  static auto* kept = std::make_unique<std::vector<std::shared_ptr<void>>>().release();
  static std::mutex mu;
  std::lock_guard<std::mutex> lk(mu);
  kept->push_back(std::move(payload));
}

DeviceReaper& DeviceReaper::of(const std::shared_ptr<Device>& device) {
  // Never destroyed: threads and devices may still run at exit, and the
  // memory is the process's to the end.
  static auto* reapers = std::make_unique<std::map<std::string, std::unique_ptr<Reaper>>>().release();
  static std::mutex mu;
  std::lock_guard<std::mutex> lk(mu);
  auto& r = (*reapers)[device->name()];
  if (!r) r = std::make_unique<Reaper>(device);
  return *r;
}

}  // namespace smddp
