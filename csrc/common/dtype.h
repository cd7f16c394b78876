// Element types and reduce operations understood by the torch-free core.
// The backend maps at::ScalarType / c10d::ReduceOp onto these; the engine,
// kernels and wire format only ever see these enums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace smddp {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,
  kCount = 9,
};

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7,
  kCount = 8,
};

size_t elementSize(DataType t);
const char* toString(DataType t);
const char* toString(ReduceOp op);
bool isFloatingPoint(DataType t);
// True when `op` has a meaning for `t` (bitwise ops only on integers and bool,
// AVG only on floating point). `why` receives the reason when false.
bool isSupported(ReduceOp op, DataType t, std::string* why = nullptr);

}  // namespace smddp
