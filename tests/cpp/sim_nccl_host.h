// Helpers of the simulated NCCL's Catch2 tests (test_sim_nccl.cc,
// test_nccl_host.cc): a host's GPUs as threads of one process, whose
// simulated communicators (device/sim_nccl.h) exchange data in memory, and
// an NcclApi that records the communicators made through it, so that a test
// can abort one itself when the code under test failed to, and the set-up
// both files open with (SimNcclFixture).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "device/sim_device.h"
#include "device/sim_nccl.h"
#include "reduce/reduce_kernels.h"

namespace sim_nccl_test {

using namespace smddp;

// The ranks of every communicator formed through connect() meet here: the
// k-th collective of each rank with the k-th of the others. A rank that
// never issues its collective is a dead peer: the others wait for it.
class InMemoryHost {
 public:
  explicit InMemoryHost(std::chrono::milliseconds formTimeout = std::chrono::seconds(10))
      : s_(std::make_shared<Shared>()), formTimeout_(formTimeout) {}

  SimNcclConnect connect() {
    return [s = s_, timeout = formTimeout_](const std::string& id, int rank,
                                            int nranks) -> std::shared_ptr<SimNcclPeers> {
      std::unique_lock<std::mutex> lk(s->mu);
      Comm& c = s->comms[id];
      c.nranks = nranks;
      ++c.joined;
      s->cv.notify_all();
      const bool all = s->cv.wait_for(lk, timeout, [&] { return c.joined >= nranks || s->released; });
      SMDDP_CHECK(all && !s->released, kTimeout,
                  "in-memory NCCL host: communicator " + id + " did not form");
      return std::make_shared<Peers>(s, id, rank, nranks);
    };
  }
  // Every exchange in flight, and every later one, throws (test cleanup).
  void release() {
    std::lock_guard<std::mutex> lk(s_->mu);
    s_->released = true;
    s_->cv.notify_all();
  }

 private:
  struct Round {
    std::vector<const void*> send;
    int posted = 0;
    int left = 0;
  };
  struct Comm {
    int nranks = 0;
    int joined = 0;
    std::map<uint64_t, Round> rounds;
  };
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::string, Comm> comms;  // guarded by mu
    bool released = false;              // guarded by mu
  };

  class Peers final : public SimNcclPeers {
   public:
    Peers(std::shared_ptr<Shared> s, std::string id, int rank, int nranks)
        : s_(std::move(s)), id_(std::move(id)), rank_(rank), nranks_(nranks) {}
    void reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                       ReduceOp op) override {
      exchange(send, [&](const std::vector<const void*>& all) {
        const size_t bytes = count * elementSize(dtype);
        std::vector<const void*> in;
        for (const void* p : all) in.push_back(static_cast<const char*>(p) + rank_ * bytes);
        reduceOrdered(recv, in.data(), in.size(), count, dtype, op, static_cast<double>(nranks_));
      });
    }
    void allGather(const void* send, void* recv, size_t count, DataType dtype) override {
      exchange(send, [&](const std::vector<const void*>& all) {
        const size_t bytes = count * elementSize(dtype);
        for (size_t r = 0; r < all.size(); ++r) {
          std::memcpy(static_cast<char*>(recv) + r * bytes, all[r], bytes);
        }
      });
    }
    void abort() override {
      std::lock_guard<std::mutex> lk(s_->mu);
      aborted_ = true;
      s_->cv.notify_all();
    }

   private:
    template <typename F>
    void exchange(const void* send, F work) {
      std::unique_lock<std::mutex> lk(s_->mu);
      const uint64_t seq = seq_++;
      Round& r = s_->comms[id_].rounds[seq];
      r.send.resize(static_cast<size_t>(nranks_));
      r.send[static_cast<size_t>(rank_)] = send;
      ++r.posted;
      s_->cv.notify_all();
      // Wait for every rank's send buffer, then for every rank to have read
      // them all (each reads the others' buffers in place).
      waitOrThrow(lk, [&] { return r.posted == nranks_; });
      const std::vector<const void*> all = r.send;
      lk.unlock();
      work(all);
      lk.lock();
      ++r.left;
      s_->cv.notify_all();
      waitOrThrow(lk, [&] { return r.left == nranks_; });
    }
    template <typename P>
    void waitOrThrow(std::unique_lock<std::mutex>& lk, P done) {
      s_->cv.wait(lk, [&] { return done() || aborted_ || s_->released; });
      SMDDP_CHECK(done(), kAborted, "in-memory NCCL host: exchange aborted");
    }

    std::shared_ptr<Shared> s_;
    std::string id_;
    int rank_, nranks_;
    uint64_t seq_ = 0;     // guarded by s_->mu
    bool aborted_ = false;  // guarded by s_->mu
  };

  std::shared_ptr<Shared> s_;
  std::chrono::milliseconds formTimeout_;
};

// Forwards to another NcclApi and keeps every communicator it made, so a
// test can end one itself (abortAll) when the code under test did not.
class RecordingNccl final : public NcclApi {
 public:
  explicit RecordingNccl(std::shared_ptr<NcclApi> inner) : inner_(std::move(inner)) {}
  std::string uniqueId() override { return inner_->uniqueId(); }
  NcclResult commInitRankNonBlocking(NcclComm* comm, int nranks, const std::string& id,
                                     int rank) override {
    const NcclResult r = inner_->commInitRankNonBlocking(comm, nranks, id, rank);
    std::lock_guard<std::mutex> lk(mu_);
    if (*comm) made_.push_back(*comm);
    return r;
  }
  NcclResult reduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           NcclComm comm, DeviceStream& stream) override {
    return inner_->reduceScatter(send, recv, count, dtype, op, comm, stream);
  }
  NcclResult allGather(const void* send, void* recv, size_t count, DataType dtype, NcclComm comm,
                       DeviceStream& stream) override {
    return inner_->allGather(send, recv, count, dtype, comm, stream);
  }
  NcclResult commGetAsyncError(NcclComm comm, NcclResult* state) override {
    return inner_->commGetAsyncError(comm, state);
  }
  NcclResult commAbort(NcclComm comm) override {
    forget(comm);
    return inner_->commAbort(comm);
  }
  NcclResult commDestroy(NcclComm comm) override {
    forget(comm);
    return inner_->commDestroy(comm);
  }
  std::string errorString(NcclResult r) override { return inner_->errorString(r); }
  std::string lastError(NcclComm comm) override { return inner_->lastError(comm); }

  // Aborts every communicator not yet aborted or destroyed; returns how many.
  int abortAll() {
    std::vector<NcclComm> left;
    {
      std::lock_guard<std::mutex> lk(mu_);
      left.swap(made_);
    }
    for (NcclComm c : left) (void)inner_->commAbort(c);
    return static_cast<int>(left.size());
  }

 private:
  void forget(NcclComm comm) {
    std::lock_guard<std::mutex> lk(mu_);
    made_.erase(std::remove(made_.begin(), made_.end(), comm), made_.end());
  }
  std::shared_ptr<NcclApi> inner_;
  std::mutex mu_;
  std::vector<NcclComm> made_;  // guarded by mu_
};

// The set-up every simulated-NCCL test opens with: the stand-in's rule
// violations cleared, a host for the communicators to meet on, and the
// simulated NCCL with `options`, recorded. Its end aborts what a failing
// run left hung and releases the host (cleanUp), also when a REQUIRE
// failed; a fixture that holds communicators calls cleanUp from its own
// destructor, before they are destroyed (a destroy waits for hung kernels).
class SimNcclFixture {
 public:
  explicit SimNcclFixture(const SimNcclOptions& options)
      : api(std::make_shared<RecordingNccl>(makeSimNccl(options, clearedHost().connect()))) {}
  SimNcclFixture(const SimNcclFixture&) = delete;
  SimNcclFixture& operator=(const SimNcclFixture&) = delete;
  ~SimNcclFixture() { cleanUp(); }

  void cleanUp() {
    api->abortAll();
    host.release();
  }

  InMemoryHost host;  // before api: api's connect() is host's
  std::shared_ptr<RecordingNccl> api;

 private:
  InMemoryHost& clearedHost() {
    sim::clearViolations();
    return host;
  }
};

}  // namespace sim_nccl_test
