#include "transport/spare_endpoints.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "common/thread_name.h"

namespace smddp {

SMDDP_PARAM_BOOL(paramSpareEndpoint, "SMDDP_SPARE_ENDPOINT", true,
                 "a group that torchft forms leaves a spare endpoint, opened in the background, "
                 "for the process's next formation (not on shm)")

namespace {

constexpr int kMaxSpares = 2;
constexpr std::chrono::milliseconds kWarmUpTimeout{2000};
constexpr std::chrono::milliseconds kTakeWait{1000};

struct Spare {
  std::string provider;
  OpenedEndpoint opened;
};

struct Wanted {
  std::string provider;
  std::chrono::steady_clock::time_point notBefore;
};

// One per process, never destroyed (a static's destructor could run after
// libfabric's own at exit). Its thread starts with the first request; an
// exit handler stops it and closes the spares before libfabric unloads.
class Reserve {
 public:
  static Reserve& instance() {
    static Reserve* r = new Reserve();
    return *r;
  }

  OpenedEndpoint take(const std::string& provider) {
    std::unique_lock<std::mutex> lock(mu_);
    if (getpid() != pid_) return {};  // a forked child: the spares are the parent's
    for (auto it = wanted_.begin(); it != wanted_.end();) {
      it = it->provider == provider ? wanted_.erase(it) : it + 1;
    }
    cv_.wait_for(lock, kTakeWait, [&] { return findReady(provider) >= 0 || opening_ != provider; });
    const int i = findReady(provider);
    if (i < 0) return {};
    OpenedEndpoint out = std::move(ready_[i].opened);
    ready_.erase(ready_.begin() + i);
    ++taken_;
    return out;
  }

  void prepare(const std::string& provider, std::chrono::milliseconds pause) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || getpid() != pid_) return;
    const int held = static_cast<int>(ready_.size() + wanted_.size()) + (opening_.empty() ? 0 : 1);
    if (held >= kMaxSpares) return;
    wanted_.push_back({provider, std::chrono::steady_clock::now() + pause});
    if (!thread_.joinable()) {
      thread_ = std::thread([this] {
        smddp::nameThisThread("smddp-spares");
        run();
      });
      std::atexit([] { Reserve::instance().stopAtExit(); });
    }
    cv_.notify_all();
  }

  SpareCounts counts() {
    std::lock_guard<std::mutex> lock(mu_);
    return {static_cast<int>(ready_.size()), opening_.empty() ? 0 : 1,
            static_cast<int>(wanted_.size()), taken_};
  }

 private:
  Reserve() : pid_(getpid()) {}

  int findReady(const std::string& provider) const {
    for (size_t i = 0; i < ready_.size(); ++i) {
      if (ready_[i].provider == provider) return static_cast<int>(i);
    }
    return -1;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (wanted_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const auto due = wanted_.front().notBefore;
      if (std::chrono::steady_clock::now() < due) {
        cv_.wait_until(lock, due);
        continue;  // taken, stopped, or due
      }
      const std::string provider = wanted_.front().provider;
      wanted_.pop_front();
      opening_ = provider;
      lock.unlock();
      OpenedEndpoint opened = open(provider);
      lock.lock();
      opening_.clear();
      if (opened.endpoint && !stop_) ready_.push_back({provider, std::move(opened)});
      cv_.notify_all();
    }
    threadDone_ = true;
    cv_.notify_all();
  }

  static OpenedEndpoint open(const std::string& provider) {
    OpenedEndpoint out;
    try {
      out = openFreshEndpoint(provider);
      if (!out.endpoint->warmUp(kWarmUpTimeout)) {
        SMDDP_LOG(kDebug) << "spare endpoint (" << provider << "): its own message did not "
                          << "come back; dropped";
        return {};
      }
    } catch (const Error& e) {
      SMDDP_LOG(kDebug) << "spare endpoint (" << provider << ") not opened: " << e.what();
      return {};
    }
    return out;
  }

  // At exit, before libfabric's destructor: the thread ends (an opening
  // finishes first, within the warm-up's bound) and the spares close. A
  // thread that does not end in time is left, and so are the spares.
  void stopAtExit() {
    std::unique_lock<std::mutex> lock(mu_);
    if (getpid() != pid_) return;
    stop_ = true;
    wanted_.clear();
    cv_.notify_all();
    if (!cv_.wait_for(lock, kWarmUpTimeout + std::chrono::seconds(1),
                      [&] { return threadDone_; })) {
      thread_.detach();
      return;
    }
    lock.unlock();
    thread_.join();
    ready_.clear();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const pid_t pid_;
  std::deque<Wanted> wanted_;
  std::vector<Spare> ready_;
  std::string opening_;  // the provider being opened, or ""
  int taken_ = 0;
  bool stop_ = false;
  bool threadDone_ = false;
  std::thread thread_;
};

}  // namespace

OpenedEndpoint takeSpareEndpoint(const std::string& provider) {
  if (provider == "shm" || !paramSpareEndpoint()) return {};
  return Reserve::instance().take(provider);
}

OpenedEndpoint openFreshEndpoint(const std::string& provider) {
  OpenedEndpoint opened;
  opened.fabric = std::make_shared<Fabric>(provider);
  opened.endpoint = std::make_unique<Endpoint>(opened.fabric);
  return opened;
}

OpenedEndpoint spareOrFreshEndpoint(const std::string& provider) {
  OpenedEndpoint opened = takeSpareEndpoint(provider);
  return opened.endpoint ? std::move(opened) : openFreshEndpoint(provider);
}

void prepareSpareEndpoint(const std::string& provider, std::chrono::milliseconds pause) {
  if (provider == "shm" || !paramSpareEndpoint()) return;
  Reserve::instance().prepare(provider, pause);
}

SpareCounts spareEndpointCounts() { return Reserve::instance().counts(); }

}  // namespace smddp
