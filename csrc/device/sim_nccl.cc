#include "device/sim_nccl.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "device/sim_device.h"

namespace smddp {

namespace {

constexpr const char* kNotReady =
    "use of communicator before the previous operation returned ncclSuccess";
// How long commAbort and commDestroy wait for the launcher thread to leave
// before they leave it behind (a launch under CUDA_LAUNCH_BLOCKING held up
// by another communicator's hung kernel on the same hardware queue).
constexpr auto kLauncherGrace = std::chrono::seconds(2);

// One simulated communicator. Kernels, the launcher thread and a detached
// init thread hold it by shared_ptr, so it outlives whichever ends last.
struct SimComm {
  int rank = 0;
  int nranks = 1;
  int device = 0;
  std::string name;  // "simulated NCCL communicator 3 (rank 0 of 2, sim:0)"

  std::mutex mu;
  std::condition_variable cv;
  // kInProgress while the last call is carried out in the background,
  // kSuccess, or the asynchronous error.
  NcclResult state = NcclResult::kSuccess;     // guarded by mu
  std::string lastError;                       // guarded by mu
  bool aborted = false;                        // guarded by mu
  std::shared_ptr<SimNcclPeers> peers;         // guarded by mu: set once formed
  uint64_t issued = 0;                         // guarded by mu: kernels queued
  uint64_t ran = 0;                            // guarded by mu: kernels done, in issue order
  int64_t collectives = 0;                     // guarded by mu: collective calls accepted
  std::deque<std::function<void()>> deferred;  // guarded by mu: the launcher's work
  bool stopLauncher = false;                   // guarded by mu
  bool launcherDone = false;                   // guarded by mu
};

using Body = std::function<void(SimNcclPeers&)>;

// Queues `body` as the communicator's next kernel on `stream`. It waits
// (holding its hardware queue) for the kernel issued before it, then meets
// the other ranks; one that cannot complete hangs until the abort.
void enqueue(const std::shared_ptr<SimComm>& c, DeviceStream& stream, int64_t index,
             int64_t failAt, Body body) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    ticket = c->issued++;
  }
  sim::hostKernel(stream, [c, ticket, index, failAt, body = std::move(body)] {
    std::unique_lock<std::mutex> lk(c->mu);
    c->cv.wait(lk, [&] { return c->ran == ticket || c->aborted; });
    bool hang = false;
    if (!c->aborted && index == failAt) {
      // The test hook: a failure NCCL's proxy reports asynchronously.
      if (c->state == NcclResult::kSuccess || c->state == NcclResult::kInProgress) {
        c->state = NcclResult::kSystemError;
        c->lastError = "simulated failure of collective " + std::to_string(index) + " on " + c->name;
      }
      hang = true;
    } else if (!c->aborted) {
      std::shared_ptr<SimNcclPeers> peers = c->peers;
      lk.unlock();
      try {
        body(*peers);
      } catch (const std::exception& e) {
        // A dead peer or a failed exchange: NCCL's kernel spins on.
        SMDDP_LOG(kDebug) << "smddp: " << c->name << ": collective " << index
                          << " cannot complete (" << e.what() << "); it hangs until aborted";
        hang = true;
      }
      lk.lock();
    }
    if (hang) c->cv.wait(lk, [&] { return c->aborted; });
    ++c->ran;
    c->cv.notify_all();
  });
}

void runLauncher(std::shared_ptr<SimComm> c) {
  smddp::nameThisThread("sim-nccl-launch");
  sim::setDevice(c->device);  // the communicator's device, as NCCL's threads
  std::unique_lock<std::mutex> lk(c->mu);
  for (;;) {
    c->cv.wait(lk, [&] { return c->stopLauncher || !c->deferred.empty(); });
    if (c->stopLauncher) break;
    auto task = std::move(c->deferred.front());
    c->deferred.pop_front();
    lk.unlock();
    task();
    lk.lock();
  }
  c->launcherDone = true;
  c->cv.notify_all();
}

// Stops the launcher; true when it left within the grace period.
bool stopLauncher(SimComm& c) {
  std::unique_lock<std::mutex> lk(c.mu);
  c.stopLauncher = true;
  c.cv.notify_all();
  return c.cv.wait_for(lk, kLauncherGrace, [&] { return c.launcherDone; });
}

class SimNccl final : public NcclApi {
 public:
  SimNccl(SimNcclOptions opts, SimNcclConnect connect)
      : opts_(opts), connect_(std::move(connect)), rng_(opts.seed) {
    SMDDP_CHECK(opts_.inProgressPercent >= 0 && opts_.inProgressPercent <= 100 &&
                    opts_.minDeferral.count() >= 0 && opts_.maxDeferral >= opts_.minDeferral &&
                    connect_,
                kInvalidArgument,
                "smddp: simulated NCCL: inProgressPercent " + std::to_string(opts_.inProgressPercent) +
                    " (needs 0..100), deferral " + std::to_string(opts_.minDeferral.count()) + ".." +
                    std::to_string(opts_.maxDeferral.count()) +
                    " us (needs 0 <= min <= max), and a connect function");
  }
  ~SimNccl() override {
    std::map<uintptr_t, std::shared_ptr<SimComm>> left;
    {
      std::lock_guard<std::mutex> lk(mu_);
      left.swap(comms_);
    }
    for (auto& [handle, c] : left) abortComm(*c);
  }

  std::string uniqueId() override {
    std::random_device rd;
    char buf[33];
    std::snprintf(buf, sizeof(buf), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    return buf;
  }

  NcclResult commInitRankNonBlocking(NcclComm* comm, int nranks, const std::string& id,
                                     int rank) override {
    *comm = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks || id.empty()) return NcclResult::kInvalidArgument;
    auto c = std::make_shared<SimComm>();
    c->rank = rank;
    c->nranks = nranks;
    c->device = sim::currentDevice();
    const bool later = roll();
    const auto delay = deferral();
    {
      std::lock_guard<std::mutex> lk(mu_);
      const uintptr_t handle = nextHandle_++;
      c->name = "simulated NCCL communicator " + std::to_string(handle) + " (rank " +
                std::to_string(rank) + " of " + std::to_string(nranks) + ", sim:" +
                std::to_string(c->device) + ")";
      comms_[handle] = c;
      *comm = reinterpret_cast<NcclComm>(handle);
    }
    std::thread(runLauncher, c).detach();
    if (opts_.failInit && opts_.failInit()) return NcclResult::kSystemError;
    if (!later) {
      form(c, connect_, id, std::chrono::microseconds(0));
      std::lock_guard<std::mutex> lk(c->mu);
      return c->state;
    }
    {
      std::lock_guard<std::mutex> lk(c->mu);
      c->state = NcclResult::kInProgress;
    }
    std::thread(form, c, connect_, id, delay).detach();
    return NcclResult::kInProgress;
  }

  NcclResult reduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           NcclComm comm, DeviceStream& stream) override {
    return collective("ncclReduceScatter", comm, stream,
                      [send, recv, count, dtype, op](SimNcclPeers& p) {
                        p.reduceScatter(send, recv, count, dtype, op);
                      });
  }
  NcclResult allGather(const void* send, void* recv, size_t count, DataType dtype, NcclComm comm,
                       DeviceStream& stream) override {
    return collective("ncclAllGather", comm, stream, [send, recv, count, dtype](SimNcclPeers& p) {
      p.allGather(send, recv, count, dtype);
    });
  }

  NcclResult commGetAsyncError(NcclComm comm, NcclResult* state) override {
    NcclResult refused;
    auto c = find(comm, "ncclCommGetAsyncError", &refused);
    if (!c) return refused;
    std::lock_guard<std::mutex> lk(c->mu);
    *state = c->state;
    return NcclResult::kSuccess;
  }

  NcclResult commAbort(NcclComm comm) override {
    NcclResult refused;
    auto c = find(comm, "ncclCommAbort", &refused, /*erase=*/true);
    if (!c) return refused;
    abortComm(*c);
    return NcclResult::kSuccess;
  }

  NcclResult commDestroy(NcclComm comm) override {
    NcclResult refused;
    auto c = find(comm, "ncclCommDestroy", &refused, /*erase=*/true);
    if (!c) return refused;
    // NCCL's waits for the operations in flight: with a hung kernel it
    // never returns. Bounded here, and a broken rule past the bound.
    std::unique_lock<std::mutex> lk(c->mu);
    const bool drained = c->cv.wait_for(lk, std::chrono::seconds(60), [&] {
      return c->aborted || (c->ran == c->issued && c->deferred.empty() &&
                            c->state != NcclResult::kInProgress);
    });
    lk.unlock();
    if (!drained) {
      sim::recordViolation("ncclCommDestroy on " + c->name +
                           " waited 60 s for kernels that never completed (abort it instead)");
    }
    abortComm(*c);  // releases the peers and the launcher
    return NcclResult::kSuccess;
  }

  std::string errorString(NcclResult r) override { return toString(r); }
  std::string lastError(NcclComm comm) override {
    std::shared_ptr<SimComm> c;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = comms_.find(reinterpret_cast<uintptr_t>(comm));
      if (it == comms_.end()) return "";
      c = it->second;
    }
    std::lock_guard<std::mutex> lk(c->mu);
    return c->lastError;
  }

 private:
  bool roll() {
    std::lock_guard<std::mutex> lk(mu_);
    return static_cast<int>(rng_() % 100) < opts_.inProgressPercent;
  }
  std::chrono::microseconds deferral() {
    std::lock_guard<std::mutex> lk(mu_);
    const auto span = static_cast<uint64_t>((opts_.maxDeferral - opts_.minDeferral).count());
    return opts_.minDeferral + std::chrono::microseconds(static_cast<int64_t>(rng_() % (span + 1)));
  }

  // The live communicator `comm`, or null and why the call is refused. A
  // call that was on its way in while another thread aborted the
  // communicator (within abortGrace) gets kInvalidUsage; any other use of
  // a communicator that is gone is a broken rule.
  std::shared_ptr<SimComm> find(NcclComm comm, const char* call, NcclResult* refused,
                                bool erase = false) {
    std::lock_guard<std::mutex> lk(mu_);
    const auto handle = reinterpret_cast<uintptr_t>(comm);
    auto it = comms_.find(handle);
    if (it == comms_.end()) {
      auto gone = abortedAt_.find(handle);
      if (gone != abortedAt_.end() && std::chrono::steady_clock::now() - gone->second < opts_.abortGrace) {
        *refused = NcclResult::kInvalidUsage;
        return nullptr;
      }
      sim::recordViolation(std::string(call) +
                           " on a communicator that was aborted, destroyed or never made");
      *refused = NcclResult::kInvalidArgument;
      return nullptr;
    }
    auto c = it->second;
    if (erase) comms_.erase(it);
    if (erase && std::string(call) == "ncclCommAbort") abortedAt_[handle] = std::chrono::steady_clock::now();
    return c;
  }

  // The init's work: connect, then (after `delay`) the communicator is ready.
  static void form(std::shared_ptr<SimComm> c, SimNcclConnect connect, std::string id,
                   std::chrono::microseconds delay) {
    smddp::nameThisThread("sim-nccl-init");
    std::shared_ptr<SimNcclPeers> peers;
    std::string failed;
    try {
      peers = connect(id, c->rank, c->nranks);
      if (!peers) failed = "the exchange was not formed";
    } catch (const std::exception& e) {
      failed = e.what();
    }
    std::unique_lock<std::mutex> lk(c->mu);
    if (delay.count() > 0) c->cv.wait_for(lk, delay, [&] { return c->aborted; });
    if (c->aborted) {
      lk.unlock();
      if (peers) peers->abort();
      return;
    }
    if (!failed.empty()) {
      c->state = NcclResult::kSystemError;
      c->lastError = "init of " + c->name + " failed: " + failed;
    } else {
      c->peers = std::move(peers);
      c->state = NcclResult::kSuccess;
    }
    c->cv.notify_all();
  }

  NcclResult collective(const char* call, NcclComm comm, DeviceStream& stream, Body body) {
    NcclResult refused;
    auto c = find(comm, call, &refused);
    if (!c) return refused;
    if (sim::deviceOf(stream) != c->device) {
      sim::recordViolation(std::string(call) + " on " + c->name + " with a stream of sim:" +
                           std::to_string(sim::deviceOf(stream)));
      return NcclResult::kUnhandledCudaError;
    }
    const bool later = roll();
    const auto delay = deferral();
    std::unique_lock<std::mutex> lk(c->mu);
    if (c->state == NcclResult::kInProgress) {
      // NCCL's ncclCommEnsureReady.
      c->lastError = kNotReady;
      lk.unlock();
      sim::recordViolation(std::string(call) + " on " + c->name + ": " + kNotReady +
                           " (ncclInvalidArgument)");
      return NcclResult::kInvalidArgument;
    }
    if (c->state != NcclResult::kSuccess) return c->state;
    const int64_t index = c->collectives++;
    const int64_t failAt = opts_.failCollective;
    if (!later) {
      lk.unlock();
      enqueue(c, stream, index, failAt, std::move(body));
      return NcclResult::kSuccess;
    }
    c->state = NcclResult::kInProgress;
    DeviceStream* s = &stream;
    c->deferred.push_back([c, s, index, failAt, delay, body = std::move(body)]() mutable {
      {
        std::unique_lock<std::mutex> dlk(c->mu);
        if (c->cv.wait_for(dlk, delay, [&] { return c->aborted; })) return;
      }
      enqueue(c, *s, index, failAt, std::move(body));
      std::lock_guard<std::mutex> dlk(c->mu);
      if (c->state == NcclResult::kInProgress) c->state = NcclResult::kSuccess;
      c->cv.notify_all();
    });
    c->cv.notify_all();
    return NcclResult::kInProgress;
  }

  static void abortComm(SimComm& c) {
    std::shared_ptr<SimNcclPeers> peers;
    {
      std::lock_guard<std::mutex> lk(c.mu);
      c.aborted = true;
      peers = c.peers;
      c.deferred.clear();
      c.cv.notify_all();
    }
    if (peers) peers->abort();
    if (!stopLauncher(c)) {
      SMDDP_LOG(kWarn) << "smddp: " << c.name << ": its launcher is still queuing a kernel "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(kLauncherGrace).count()
                       << " ms after the abort; leaving it behind";
    }
  }

  const SimNcclOptions opts_;
  const SimNcclConnect connect_;
  std::mutex mu_;
  std::mt19937_64 rng_;                                 // guarded by mu_
  std::map<uintptr_t, std::shared_ptr<SimComm>> comms_;  // guarded by mu_: the live ones
  std::map<uintptr_t, std::chrono::steady_clock::time_point> abortedAt_;  // guarded by mu_
  uintptr_t nextHandle_ = 1;                            // guarded by mu_
};

}  // namespace

std::shared_ptr<NcclApi> makeSimNccl(SimNcclOptions opts, SimNcclConnect connect) {
  return std::make_shared<SimNccl>(opts, std::move(connect));
}

}  // namespace smddp
