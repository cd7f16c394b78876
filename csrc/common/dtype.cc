#include "common/dtype.h"

namespace smddp {

size_t elementSize(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kBool: return 1;
    default: return 0;
  }
}

const char* toString(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kBool: return "bool";
    default: return "unknown-dtype";
  }
}

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kAvg: return "AVG";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kProduct: return "PRODUCT";
    case ReduceOp::kBand: return "BAND";
    case ReduceOp::kBor: return "BOR";
    case ReduceOp::kBxor: return "BXOR";
    default: return "unknown-op";
  }
}

bool isFloatingPoint(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 ||
         t == DataType::kFloat16 || t == DataType::kBFloat16;
}

bool isSupported(ReduceOp op, DataType t, std::string* why) {
  if (elementSize(t) == 0 || op >= ReduceOp::kCount) {
    if (why) *why = "unknown dtype or op";
    return false;
  }
  switch (op) {
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if (isFloatingPoint(t)) {
        if (why) *why = "bitwise reductions are defined only for integer and bool tensors";
        return false;
      }
      return true;
    case ReduceOp::kAvg:
      if (!isFloatingPoint(t)) {
        if (why) *why = "AVG is defined only for floating-point tensors";
        return false;
      }
      return true;
    default:
      return true;
  }
}

}  // namespace smddp
