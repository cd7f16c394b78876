// Names c10d changed between the torch releases the backend builds against.
// The CPU and CUDA builds here pin 2.13 and 2.14; a GPU machine may carry an
// older torch of its own (2.11 when last seen), and the extension is built
// there against that one.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/version.h>

namespace c10d_smddp {

// PREMUL_SUM's factor: NCCLPreMulSumSupplement and makeNCCLPreMulSum until
// torch 2.12 or 2.13 renamed them (2.13 keeps the old type's name as an alias).
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13
using PreMulSumSupplement = c10d::NCCLPreMulSumSupplement;
#else
using PreMulSumSupplement = c10d::PreMulSumSupplement;
#endif

inline c10d::ReduceOp makePreMulSum(const at::Tensor& factor) {
  c10d::ReduceOp op;
  op.op_ = c10d::ReduceOp::PREMUL_SUM;
  op.supplement_ = c10::make_intrusive<PreMulSumSupplement>(factor);
  return op;
}

}  // namespace c10d_smddp
