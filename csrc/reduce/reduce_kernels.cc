// Scalar reduce kernels, kernel selection and the tiled driver. The scalar
// kernels are the reference the AVX2 ones (reduce_kernels_avx2.cc) must match
// bit for bit; see reduce_kernels_internal.h for the per-element rules.
#include "reduce/reduce_kernels.h"

#include <atomic>
#include <cstring>
#include <string>

#include "common/error.h"
#include "reduce/reduce_kernels_internal.h"

namespace smddp {
namespace {

using namespace reduce_internal;

// atomic: flipped by tests and benchmarks, read on every dispatch.
std::atomic<bool> gForceScalar{false};

bool useAvx2() { return !gForceScalar.load(std::memory_order_relaxed) && avx2Available(); }

// ---- Scalar tile steps ----

template <class T>
void loadCopy(void* acc, const void* in, size_t len) {
  if (acc != in) std::memcpy(acc, in, len * sizeof(T));
}

// torch keeps bools as 0/1 bytes, but a foreign buffer may not; normalising on
// load keeps every output exactly 0 or 1.
void loadBool(void* acc, const void* in, size_t len) {
  auto* a = static_cast<uint8_t*>(acc);
  const auto* s = static_cast<const uint8_t*>(in);
  for (size_t i = 0; i < len; ++i) a[i] = s[i] != 0;
}

template <float (*Decode)(uint16_t)>
void loadWide(void* acc, const void* in, size_t len) {
  auto* a = static_cast<float*>(acc);
  const auto* s = static_cast<const uint16_t*>(in);
  for (size_t i = 0; i < len; ++i) a[i] = Decode(s[i]);
}

template <uint16_t (*Encode)(float)>
void storeNarrow(void* out, const void* acc, size_t len) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* a = static_cast<const float*>(acc);
  for (size_t i = 0; i < len; ++i) o[i] = Encode(a[i]);
}

template <class T, class Op>
void combineDirect(void* acc, const void* in, size_t len) {
  auto* a = static_cast<T*>(acc);
  const auto* s = static_cast<const T*>(in);
  for (size_t i = 0; i < len; ++i) a[i] = Op::apply(a[i], s[i]);
}

template <class Op>
void combineBool(void* acc, const void* in, size_t len) {
  auto* a = static_cast<uint8_t*>(acc);
  const auto* s = static_cast<const uint8_t*>(in);
  for (size_t i = 0; i < len; ++i) a[i] = Op::apply(a[i], static_cast<uint8_t>(s[i] != 0));
}

template <float (*Decode)(uint16_t), class Op>
void combineWide(void* acc, const void* in, size_t len) {
  auto* a = static_cast<float*>(acc);
  const auto* s = static_cast<const uint16_t*>(in);
  for (size_t i = 0; i < len; ++i) a[i] = Op::apply(a[i], Decode(s[i]));
}

// Division (not multiplication by a reciprocal) so AVG is correctly rounded.
template <class F>
void divideFloat(void* acc, size_t len, double divisor) {
  auto* a = static_cast<F*>(acc);
  const F d = static_cast<F>(divisor);
  for (size_t i = 0; i < len; ++i) a[i] = a[i] / d;
}

// ---- Kernel tables. `op` is already checked by isSupported and never kAvg. ----

template <class T>
TileKernels directKernels(ReduceOp op) {
  TileKernels k;
  k.load = loadCopy<T>;
  if constexpr (std::is_floating_point_v<T>) k.divide = divideFloat<T>;
  switch (op) {
    case ReduceOp::kMin: k.combine = combineDirect<T, MinOp>; break;
    case ReduceOp::kMax: k.combine = combineDirect<T, MaxOp>; break;
    case ReduceOp::kProduct: k.combine = combineDirect<T, ProductOp>; break;
    default: k.combine = combineDirect<T, SumOp>; break;
  }
  if constexpr (std::is_integral_v<T>) {
    if (op == ReduceOp::kBand) k.combine = combineDirect<T, BandOp>;
    if (op == ReduceOp::kBor) k.combine = combineDirect<T, BorOp>;
    if (op == ReduceOp::kBxor) k.combine = combineDirect<T, BxorOp>;
  }
  return k;
}

template <float (*Decode)(uint16_t), uint16_t (*Encode)(float)>
TileKernels wideKernels(ReduceOp op) {
  TileKernels k;
  k.load = loadWide<Decode>;
  k.divide = divideFloat<float>;
  k.store = storeNarrow<Encode>;
  switch (op) {
    case ReduceOp::kMin: k.combine = combineWide<Decode, MinOp>; break;
    case ReduceOp::kMax: k.combine = combineWide<Decode, MaxOp>; break;
    case ReduceOp::kProduct: k.combine = combineWide<Decode, ProductOp>; break;
    default: k.combine = combineWide<Decode, SumOp>; break;
  }
  return k;
}

// On 0/1 values: SUM and MAX are OR, PRODUCT and MIN are AND (as in torch).
TileKernels boolKernels(ReduceOp op) {
  TileKernels k;
  k.load = loadBool;
  switch (op) {
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand: k.combine = combineBool<BandOp>; break;
    case ReduceOp::kBxor: k.combine = combineBool<BxorOp>; break;
    default: k.combine = combineBool<BorOp>; break;
  }
  return k;
}

TileKernels scalarKernels(DataType t, ReduceOp op) {
  switch (t) {
    case DataType::kFloat32: return directKernels<float>(op);
    case DataType::kFloat64: return directKernels<double>(op);
    case DataType::kFloat16: return wideKernels<halfToFloat, floatToHalf>(op);
    case DataType::kBFloat16: return wideKernels<bf16ToFloat, floatToBf16>(op);
    case DataType::kInt8: return directKernels<int8_t>(op);
    case DataType::kUInt8: return directKernels<uint8_t>(op);
    case DataType::kInt32: return directKernels<int32_t>(op);
    case DataType::kInt64: return directKernels<int64_t>(op);
    case DataType::kBool: return boolKernels(op);
    default: break;
  }
  throwError(ErrorKind::kInternal, std::string("no reduce kernel for dtype ") + toString(t));
}

TileKernels selectKernels(const char* caller, DataType t, ReduceOp op) {
  std::string why;
  if (!isSupported(op, t, &why)) {
    throwError(ErrorKind::kInvalidArgument, std::string(caller) + ": reduce op " + toString(op) +
                                                " is not supported for dtype " + toString(t) + " (" +
                                                why + ")");
  }
  const ReduceOp combineOp = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  TileKernels k = scalarKernels(t, combineOp);
  if (useAvx2()) overlayAvx2Kernels(t, combineOp, &k);
  return k;
}

// out = in[0] op in[1] op ... op in[n-1] (then / divisor when `divide`),
// one tile at a time.
// `outSize` differs from `inSize` only when the f32 accumulator itself is
// the output (reduceOrderedToFloat).
void runTiles(const TileKernels& k, size_t inSize, size_t outSize, void* out,
              const void* const* inputs, size_t n, size_t count, bool divide, double divisor) {
  // Only f16/bf16 need it; uninitialised on purpose (load fills it).
  float staging[kTileElems];
  // When `out` is also a later input (a server reducing into its own
  // buffer), accumulate each tile aside so that input is read intact.
  bool outIsLaterInput = false;
  for (size_t j = 1; j < n; ++j) outIsLaterInput = outIsLaterInput || inputs[j] == out;
  alignas(64) std::byte aside[kTileElems * sizeof(double)];
  for (size_t off = 0; off < count; off += kTileElems) {
    const size_t len = std::min(kTileElems, count - off);
    const size_t byteOff = off * inSize;
    void* dst = static_cast<std::byte*>(out) + off * outSize;
    void* acc = k.store ? static_cast<void*>(staging)
                        : (outIsLaterInput ? static_cast<void*>(aside) : dst);
    // Stream each input through the tile once, strictly left to right, so
    // the order of operations per element never depends on tiling or ISA.
    k.load(acc, static_cast<const std::byte*>(inputs[0]) + byteOff, len);
    for (size_t j = 1; j < n; ++j) {
      k.combine(acc, static_cast<const std::byte*>(inputs[j]) + byteOff, len);
    }
    if (divide) k.divide(acc, len, divisor);
    if (k.store) k.store(dst, acc, len);
    else if (acc != dst) std::memcpy(dst, acc, len * outSize);
  }
}

}  // namespace

void reduceOrdered(void* out, const void* const* inputs, size_t n, size_t count, DataType dtype,
                   ReduceOp op, double avgDivisor) {
  const TileKernels k = selectKernels("reduceOrdered", dtype, op);
  SMDDP_CHECK(n >= 1, kInvalidArgument, "reduceOrdered: needs at least one input");
  runTiles(k, elementSize(dtype), elementSize(dtype), out, inputs, n, count, op == ReduceOp::kAvg,
           avgDivisor);
}

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  const TileKernels k = selectKernels("reduceInto", dtype, op);
  const void* inputs[2] = {dst, src};
  runTiles(k, elementSize(dtype), elementSize(dtype), dst, inputs, 2, count, false, 1.0);
}

void finishAverage(void* data, size_t count, DataType dtype, double divisor) {
  const TileKernels k = selectKernels("finishAverage", dtype, ReduceOp::kAvg);
  const void* inputs[1] = {data};
  runTiles(k, elementSize(dtype), elementSize(dtype), data, inputs, 1, count, true, divisor);
}

void reduceOrderedToFloat(float* out, const void* const* inputs, size_t n, size_t count,
                          DataType dtype, ReduceOp op) {
  SMDDP_CHECK(dtype == DataType::kFloat16 || dtype == DataType::kBFloat16, kInvalidArgument,
              std::string("reduceOrderedToFloat: f16/bf16 only, got ") + toString(dtype));
  SMDDP_CHECK(n >= 1, kInvalidArgument, "reduceOrderedToFloat: needs at least one input");
  TileKernels k = selectKernels("reduceOrderedToFloat", dtype, op);
  // The f32 tile goes out as it is: no rounding.
  k.store = [](void* dst, const void* acc, size_t len) { std::memcpy(dst, acc, len * 4); };
  runTiles(k, elementSize(dtype), sizeof(float), out, inputs, n, count, false, 1.0);
}

void narrowFromFloat(void* out, const float* in, size_t count, DataType dtype) {
  SMDDP_CHECK(dtype == DataType::kFloat16 || dtype == DataType::kBFloat16, kInvalidArgument,
              std::string("narrowFromFloat: f16/bf16 only, got ") + toString(dtype));
  const StoreFn store = selectKernels("narrowFromFloat", dtype, ReduceOp::kSum).store;
  // Front to back, one tile at a time, each read whole before it is
  // written: the narrow output of a tile only covers f32 elements at or
  // below that tile, so `out` may be `in` itself.
  float tile[kTileElems];
  const size_t es = elementSize(dtype);
  for (size_t off = 0; off < count; off += kTileElems) {
    const size_t len = std::min(kTileElems, count - off);
    std::memcpy(tile, in + off, len * sizeof(float));
    store(static_cast<std::byte*>(out) + off * es, tile, len);
  }
}

uint32_t maxFiniteMagnitudeBits(const float* src, size_t count) {
  return useAvx2() ? maxFiniteMagnitudeBitsAvx2(src, count)
                   : maxFiniteMagnitudeBitsScalar(src, count);
}

const char* reduceKernelIsa() { return useAvx2() ? "avx2" : "scalar"; }

bool setForceScalarKernels(bool force) { return gForceScalar.exchange(force); }

}  // namespace smddp
