// The stand-in's NCCL inside the host (intra.h): the simulated NCCL
// (device/sim_nccl.h), which follows NCCL's rules (ncclInProgress at
// random, a kernel that hangs until the abort when a peer is gone, one
// order per communicator across streams, kernels that share the simulated
// device's hardware queues), with its data moved by a CPU group of the
// host's ranks, formed through the store under the communicator's unique
// id. The intra-host communicator over it (device/nccl_host.h) is the code
// that drives NCCL on a GPU.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>

#include "backend/intra.h"
#include "backend/process_group.h"
#include "common/param.h"
#include "device/sim_nccl.h"

namespace c10d_smddp {

SMDDP_PARAM_INT(paramSimNcclInProgress, "SMDDP_DEVICE_SIM_NCCL_IN_PROGRESS", 50, 0, 100,
                "Test hook: percent of the stand-in NCCL's init and collective calls that "
                "return ncclInProgress (their work then happens later, from another thread)");

SMDDP_PARAM_INT(paramSimNcclFailInits, "SMDDP_DEVICE_SIM_NCCL_FAIL_INITS", 0, 0, 1000,
                "Test hook: the number of the process's first stand-in NCCL inits that fail "
                "(kSystemError, as a failed bootstrap)");

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

// The exchange of one simulated communicator: a CPU group of the host's
// ranks. A failure there (a peer died) throws, and the simulated kernel
// then hangs until the communicator is aborted, as NCCL's does.
class CpuGroupPeers final : public smddp::SimNcclPeers {
 public:
  explicit CpuGroupPeers(c10::intrusive_ptr<ProcessGroupSmddp> local) : local_(std::move(local)) {}
  ~CpuGroupPeers() override { abort(); }

  void reduceScatter(const void* send, void* recv, size_t count, smddp::DataType dtype,
                     smddp::ReduceOp op) override {
    const auto st = scalarType(dtype);
    const auto g = static_cast<int64_t>(local_->getSize());
    at::Tensor in = at::from_blob(const_cast<void*>(send), {static_cast<int64_t>(count) * g},
                                  at::TensorOptions().dtype(st));
    at::Tensor out = at::from_blob(recv, {static_cast<int64_t>(count)}, at::TensorOptions().dtype(st));
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10dOp(op);
    if (auto w = local_->_reduce_scatter_base(out, in, o)) w->wait();
  }
  void allGather(const void* send, void* recv, size_t count, smddp::DataType dtype) override {
    const auto st = scalarType(dtype);
    const auto g = static_cast<int64_t>(local_->getSize());
    at::Tensor in = at::from_blob(const_cast<void*>(send), {static_cast<int64_t>(count)},
                                  at::TensorOptions().dtype(st));
    at::Tensor out = at::from_blob(recv, {static_cast<int64_t>(count) * g}, at::TensorOptions().dtype(st));
    if (auto w = local_->_allgather_base(out, in, c10d::AllgatherOptions())) w->wait();
  }
  void abort() override {
    if (!aborted_.exchange(true)) local_->shutdown();
  }

 private:
  c10::intrusive_ptr<ProcessGroupSmddp> local_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::shared_ptr<smddp::NcclApi> makeSimNcclApi(const c10::intrusive_ptr<c10d::Store>& store,
                                               const std::string& groupName,
                                               std::chrono::milliseconds timeout, uint64_t seed) {
  smddp::SimNcclOptions o;
  o.inProgressPercent = static_cast<int>(paramSimNcclInProgress());
  o.seed = seed;
  o.failInit = [] {
    static std::atomic<int64_t> left{paramSimNcclFailInits()};  // across the process's groups
    return left.fetch_sub(1) > 0;
  };
  return smddp::makeSimNccl(o, [store, groupName, timeout](const std::string& id, int rank, int n) {
    // Ranks given the same unique id meet under it, as NCCL's do.
    auto local = c10::make_intrusive<ProcessGroupSmddp>(
        c10::make_intrusive<c10d::PrefixStore>("smddp_intra/sim/" + id + "/", store), rank, n,
        timeout, groupName + "/intra", GroupOptions{.hostOnly = true});
    return std::make_shared<CpuGroupPeers>(std::move(local));
  });
}

}  // namespace c10d_smddp
