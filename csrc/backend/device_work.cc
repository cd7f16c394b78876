// DeviceWork, the Work of a call on the GPU path (device_collectives.h):
// done once its host part ended and its copies back completed, with
// CUDA-stream semantics for wait() and the future; and the Work that
// gathers several of them (a coalesced block, a batch, a barrier).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <set>
#include <string>

#include "backend/call_support.h"
#include "backend/device_collectives.h"
#include "backend/work.h"
#include "common/caller_waiting.h"
#include "common/completion_pool.h"
#include "common/error.h"

namespace c10d_smddp {

namespace {

// c10d::Work keeps its profiling title's pointer: titles live as long as
// the process.
const char* internTitle(const std::string& title) {
  static std::mutex mu;
  static auto* titles = std::make_unique<std::set<std::string>>().release();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  return titles->insert(title).first->c_str();
}

}  // namespace

// ---- DeviceWork -------------------------------------------------------------

DeviceWork::DeviceWork(std::shared_ptr<DeviceContext> ctx, int rank, c10d::OpType type,
                       const char* coll, std::vector<at::Tensor> outputs,
                       std::chrono::milliseconds timeout, bool syncOnWait)
    : c10d::Work(rank, type, internTitle("smddp:" + std::string(coll))),
      ctx_(std::move(ctx)),
      title_("smddp:" + std::string(coll)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      syncOnWait_(syncOnWait),
      future_(ctx_->newFuture()) {}

void DeviceWork::hostFinished(std::exception_ptr error, std::vector<smddp::DeviceEventPtr> done) {
  std::vector<Listener> listeners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hostDone_ = true;
    error_ = error ? toTorchError(error) : nullptr;
    done_ = std::move(done);
    listeners.swap(listeners_);
    completeLocked();
  }
  for (auto& l : listeners) l(error_, done_);
}

void DeviceWork::setSourceRank(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  sourceRank_ = rank;
}

bool DeviceWork::hostEnded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hostDone_;
}

int DeviceWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sourceRank_;
}

void DeviceWork::onHostFinished(Listener l) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!hostDone_) {
      listeners_.push_back(std::move(l));
      return;
    }
  }
  l(error_, done_);
}

void DeviceWork::completeLocked() {
  cv_.notify_all();
  finish(error_);  // c10d's own state and the profiler's end of the call
  // On the completion pool: the future's callbacks are user code (DDP's
  // hooks) that may issue and wait for more collectives, which must never
  // happen on the pipeline thread (common/completion_pool.h).
  auto self = c10::intrusive_ptr<DeviceWork>::reclaim_copy(this);
  smddp::CompletionPool::instance().post([self, error = error_, done = done_] {
    // First: this task may let go of the last reference to the call, its
    // events and its future's, and destroying an event is a CUDA call
    // made on the thread's current device. An unbound pool thread's is
    // device 0, where every rank would then make a context (issue 53,
    // defect 2).
    try {
      self->ctx_->device()->bindThread();
    } catch (...) {
      if (!error) {
        self->future_->setError(toTorchError(std::current_exception()));
        return;
      }
    }
    if (error) {
      self->future_->setError(error);
      return;
    }
    try {
      self->ctx_->completeFuture(self->future_, c10::IValue(self->outputs_), done);
    } catch (...) {
      if (!self->future_->completed()) self->future_->setError(toTorchError(std::current_exception()));
    }
  });
}

bool DeviceWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  std::vector<smddp::DeviceEventPtr> done;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // The host part: its failure must reach this call.
    if (!cv_.wait_for(lock, limit, [&] { return hostDone_; })) {
      C10_THROW_ERROR(DistBackendError, title_ + " did not complete within " +
                                            std::to_string(limit.count()) + " ms");
    }
    if (error_) std::rethrow_exception(error_);
    done = done_;
  }
  // The copies back: the caller's stream waits for them, the host does not.
  auto entered = ctx_->enter();
  for (const auto& e : done) ctx_->streamWaits(e);
  if (syncOnWait_) {
    try {
      ctx_->synchronizeCaller(limit);
    } catch (const smddp::Error& e) {
      rethrowAsTorch(e);
    }
  }
  return true;
}

bool DeviceWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!hostDone_) return false;
  if (error_) return true;
  return std::all_of(done_.begin(), done_.end(), [](const auto& e) { return e->query(); });
}

bool DeviceWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hostDone_ && !error_;
}

std::exception_ptr DeviceWork::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

c10::intrusive_ptr<c10d::Work> coalescedDeviceWork(
    std::shared_ptr<DeviceContext> ctx, int rank,
    const std::vector<c10::intrusive_ptr<c10d::Work>>& works, std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> outputs;
  for (const auto& w : works) {
    for (auto& t : w->result()) outputs.push_back(t);
  }
  return gatheredDeviceWork(std::move(ctx), rank, works, timeout, c10d::OpType::COALESCED,
                            "coalesced", std::move(outputs), /*syncOnWait=*/false);
}

c10::intrusive_ptr<c10d::Work> gatheredDeviceWork(
    std::shared_ptr<DeviceContext> ctx, int rank,
    const std::vector<c10::intrusive_ptr<c10d::Work>>& works, std::chrono::milliseconds timeout,
    c10d::OpType type, const char* coll, std::vector<at::Tensor> outputs, bool syncOnWait) {
  // The Work's future belongs to the group's device, whatever the caller's
  // current one is (the coalesced block's end runs on the caller's thread).
  auto entered = ctx->enter();
  auto all = c10::make_intrusive<DeviceWork>(ctx, rank, type, coll, std::move(outputs), timeout,
                                             syncOnWait);
  if (!works.empty()) all->setSequence(works.back()->getSequencenumber());
  struct Gather {
    std::mutex mu;
    size_t left;
    std::exception_ptr error;
    std::vector<smddp::DeviceEventPtr> done;
  };
  auto g = std::make_shared<Gather>();
  g->left = works.size();
  auto arrive = [g, all](std::exception_ptr e, const std::vector<smddp::DeviceEventPtr>& done) {
    std::unique_lock<std::mutex> lock(g->mu);
    if (e && !g->error) g->error = e;
    g->done.insert(g->done.end(), done.begin(), done.end());
    if (--g->left > 0) return;
    auto error = g->error;
    auto events = std::move(g->done);
    lock.unlock();
    all->hostFinished(error, error ? std::vector<smddp::DeviceEventPtr>{} : std::move(events));
  };
  if (works.empty()) all->hostFinished(nullptr, {});
  for (const auto& w : works) {
    if (auto* dw = dynamic_cast<DeviceWork*>(w.get())) {
      dw->onHostFinished(arrive);
    } else {
      // A CPU call in the block: its completion, no device events.
      w->getFuture()->addCallback([arrive](c10::ivalue::Future& f) {
        arrive(f.hasError() ? f.exception_ptr() : nullptr, {});
      });
    }
  }
  return all;
}

}  // namespace c10d_smddp
