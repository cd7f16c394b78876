#include "device/intra_host.h"

namespace smddp {

bool intraHostSupports(DataType dtype, ReduceOp op) {
  // NCCL has no bitwise reductions, and its bool would be uint8 arithmetic.
  if (dtype == DataType::kBool) return false;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kProduct:
      return true;
    case ReduceOp::kAvg:
      return isFloatingPoint(dtype);
    default:
      return false;
  }
}

}  // namespace smddp
