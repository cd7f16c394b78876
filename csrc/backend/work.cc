#include "backend/work.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <sched.h>

#include "common/caller_waiting.h"
#include "common/completion_pool.h"
#include "common/error.h"

namespace c10d_smddp {

namespace {
std::atomic<int64_t> gDefaultSpinUs{0};  // set by each new process group
}  // namespace

WorkSmddp::WorkSmddp(int rank, c10d::OpType opType, const char* profilingTitle,
                     std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs)
    : c10d::Work(rank, opType, profilingTitle, inputs),
      outputs_(std::move(outputs)),
      inputsKeptAlive_(inputs),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))),
      spin_(gDefaultSpinUs.load()) {}

std::exception_ptr toTorchError(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error&) {
    return e;
  } catch (const std::exception& ex) {
    try {
      C10_THROW_ERROR(DistBackendError, ex.what());
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return e;
  }
  return e;
}

void WorkSmddp::setDefaultSpin(std::chrono::microseconds spin) { gDefaultSpinUs = spin.count(); }

bool WorkSmddp::wait(std::chrono::milliseconds timeout) {
  smddp::CallerWaiting waiting;  // the engine may poll meanwhile
  if (spin_.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + spin_;
    while (!engineDone_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < until) {
      sched_yield();
    }
  }
  return c10d::Work::wait(timeout);
}

c10::intrusive_ptr<c10::ivalue::Future> WorkSmddp::getFuture() {
  int state = kUntaken;
  if (!futureState_.compare_exchange_strong(state, kTaken) && state == kInline) {
    // complete() is marking it on the engine thread, with no callbacks to
    // run: a moment. Callbacks added afterwards run on the caller's thread.
    while (futureState_.load(std::memory_order_acquire) != kMarked) sched_yield();
  }
  return future_;
}

void WorkSmddp::completeFuture(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
    finish(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  inputsKeptAlive_.clear();
  engineDone_.store(true, std::memory_order_release);
}

void WorkSmddp::complete(std::exception_ptr error) {
  if (!error && finisher_) {
    try {
      finisher_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) error = toTorchError(error);
  int state = kUntaken;
  if (futureState_.compare_exchange_strong(state, kInline)) {
    // Nobody holds the future, so no callback can run here.
    completeFuture(error);
    futureState_.store(kMarked, std::memory_order_release);
    return;
  }
  // The future is out: its callbacks (DDP's comm hooks, user `then`s) may
  // issue a collective and wait for it, which this engine thread would have
  // to run. The Work completes with its future, so wait() then value() on
  // the future stays valid.
  smddp::CompletionPool::instance().post(
      [self = c10::intrusive_ptr<WorkSmddp>::reclaim_copy(this), error] {
        self->completeFuture(error);
      });
}

}  // namespace c10d_smddp
