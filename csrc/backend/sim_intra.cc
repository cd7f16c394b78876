// The stand-in's intra-host collectives (intra.h): what NCCL does over
// NVLink, done by a CPU group of the host's ranks, as kernels on the
// simulated device. Like NCCL's, each occupies its hardware queue until
// every rank of the host has issued it, so the stand-in's queue rules apply
// to it too; and like NCCL's, the operations of one communicator run in the
// order they were issued, whatever streams they were issued on. A failure
// becomes the communicator's asynchronous error.
#include <ATen/ATen.h>

#include <condition_variable>
#include <exception>
#include <mutex>

#include "backend/call_support.h"
#include "backend/intra.h"
#include "backend/process_group.h"
#include "device/sim_device.h"

namespace c10d_smddp {

namespace {

at::ScalarType scalarType(smddp::DataType t) {
  switch (t) {
    case smddp::DataType::kFloat32: return at::kFloat;
    case smddp::DataType::kFloat64: return at::kDouble;
    case smddp::DataType::kFloat16: return at::kHalf;
    case smddp::DataType::kBFloat16: return at::kBFloat16;
    case smddp::DataType::kInt8: return at::kChar;
    case smddp::DataType::kUInt8: return at::kByte;
    case smddp::DataType::kInt32: return at::kInt;
    case smddp::DataType::kInt64: return at::kLong;
    default: return at::kBool;
  }
}

c10d::ReduceOp c10dOp(smddp::ReduceOp op) {
  switch (op) {
    case smddp::ReduceOp::kAvg: return c10d::ReduceOp::AVG;
    case smddp::ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case smddp::ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case smddp::ReduceOp::kProduct: return c10d::ReduceOp::PRODUCT;
    default: return c10d::ReduceOp::SUM;
  }
}

class SimIntraHost final : public smddp::IntraHost {
 public:
  explicit SimIntraHost(c10::intrusive_ptr<ProcessGroupSmddp> local) : local_(std::move(local)) {}
  ~SimIntraHost() override { abort(); }

  int rank() const override { return local_->getRank(); }
  int size() const override { return local_->getSize(); }

  void reduceScatter(smddp::DeviceStream& stream, const void* send, void* recv, size_t count,
                     smddp::DataType dtype, smddp::ReduceOp op) override {
    const auto st = scalarType(dtype);
    const int g = size();
    kernel(stream, [send, recv, count, st, op, g](ProcessGroupSmddp& pg) {
      at::Tensor in = at::from_blob(const_cast<void*>(send), {static_cast<int64_t>(count) * g},
                                    at::TensorOptions().dtype(st));
      at::Tensor out = at::from_blob(recv, {static_cast<int64_t>(count)}, at::TensorOptions().dtype(st));
      c10d::ReduceScatterOptions o;
      o.reduceOp = c10dOp(op);
      return pg._reduce_scatter_base(out, in, o);
    });
  }
  void allGather(smddp::DeviceStream& stream, const void* send, void* recv, size_t count,
                 smddp::DataType dtype) override {
    const auto st = scalarType(dtype);
    const int g = size();
    kernel(stream, [send, recv, count, st, g](ProcessGroupSmddp& pg) {
      at::Tensor in = at::from_blob(const_cast<void*>(send), {static_cast<int64_t>(count)},
                                    at::TensorOptions().dtype(st));
      at::Tensor out = at::from_blob(recv, {static_cast<int64_t>(count) * g}, at::TensorOptions().dtype(st));
      return pg._allgather_base(out, in, c10d::AllgatherOptions());
    });
  }
  void checkHealthy() override {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->error) std::rethrow_exception(state_->error);
  }
  void abort() override {
    {
      std::lock_guard<std::mutex> lk(state_->mu);
      if (state_->aborted) return;
      state_->aborted = true;
    }
    state_->cv.notify_all();
    local_->shutdown();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::exception_ptr error;  // guarded by mu
    bool aborted = false;      // guarded by mu
    uint64_t ran = 0;          // operations done, in issue order; guarded by mu
  };
  template <typename F>
  void kernel(smddp::DeviceStream& stream, F body) {
    const uint64_t ticket = issued_++;  // one issuing thread: the pipeline's
    smddp::sim::hostKernel(stream, [local = local_, state = state_, body, ticket] {
      std::unique_lock<std::mutex> lk(state->mu);
      state->cv.wait(lk, [&] { return state->ran == ticket || state->aborted; });
      const bool skip = state->error || state->aborted;  // as NCCL after an error: no more work
      lk.unlock();
      if (!skip) {
        try {
          if (auto w = body(*local)) w->wait();
        } catch (...) {
          std::lock_guard<std::mutex> elk(state->mu);
          if (!state->error) state->error = std::current_exception();
        }
      }
      lk.lock();
      ++state->ran;
      state->cv.notify_all();
    });
  }
  uint64_t issued_ = 0;  // the pipeline thread's only

  c10::intrusive_ptr<ProcessGroupSmddp> local_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace

std::unique_ptr<smddp::IntraHost> makeSimIntraHost(c10::intrusive_ptr<ProcessGroupSmddp> local) {
  return std::make_unique<SimIntraHost>(std::move(local));
}

}  // namespace c10d_smddp
