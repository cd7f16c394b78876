// Internals shared by the scalar and AVX2 reduce kernels: per-element
// semantics (wrapping integer ops, NaN-propagating min/max, f16/bf16 rounding)
// and the tile-kernel table that reduceOrdered drives. Both ISAs use these
// definitions so their results agree bit for bit.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"

namespace smddp::reduce_internal {

// Elements per tile: 16 KiB of f32 accumulator, small enough to stay in L1/L2
// while every input streams through it once.
constexpr size_t kTileElems = 4096;

// ---- f16 / bf16 <-> f32. NaNs keep sign and top payload bits and come out
// quiet, which is what F16C's vcvtph2ps / vcvtps2ph do. ----

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {  // inf, or NaN (quietened)
    return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24 is exact in f32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// IEEE binary32 -> binary16, round to nearest, ties to even.
inline uint16_t floatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (incl. inf)
  uint32_t h;
  uint32_t rem;
  uint32_t halfway;
  if (a >= 0x38800000u) {  // result is a normal half: rebias exponent by 127-15
    h = (a >> 13) - (112u << 10);
    rem = a & 0x1FFFu;
    halfway = 0x1000u;
  } else {
    if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 ties to 0
    // Subnormal half: mantissa (with hidden bit) scaled to units of 2^-24.
    const uint32_t shift = 126u - (a >> 23);  // 14..24
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    h = m >> shift;
    rem = m & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1u);
  }
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // carry may bump the exponent
  return static_cast<uint16_t>(sign | h);
}

inline float bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t floatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// ---- Element ops. Integers wrap modulo 2^bits like torch; the arithmetic is
// done in an unsigned type at least as wide as `unsigned` so it never
// overflows a signed type. ----

template <class T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <class F>
using FloatBits = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;

struct SumOp {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
    } else {
      return a + b;
    }
  }
};

struct ProductOp {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
    } else {
      return a * b;
    }
  }
};

// Floats: NaN wins (the first NaN operand is returned), and -0 < +0 so the
// result does not depend on operand order.
struct MinOp {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return std::min(a, b);
    } else {
      if (a < b) return a;
      if (b < a) return b;
      if (a == b) return std::bit_cast<T>(std::bit_cast<FloatBits<T>>(a) | std::bit_cast<FloatBits<T>>(b));
      return a != a ? a : b;
    }
  }
};

struct MaxOp {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return std::max(a, b);
    } else {
      if (a > b) return a;
      if (b > a) return b;
      if (a == b) return std::bit_cast<T>(std::bit_cast<FloatBits<T>>(a) & std::bit_cast<FloatBits<T>>(b));
      return a != a ? a : b;
    }
  }
};

struct BandOp {
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(a & b); }
};
struct BorOp {
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(a | b); }
};
struct BxorOp {
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(a ^ b); }
};

// ---- The per-tile steps of one (dtype, op). The accumulator is the output
// buffer itself, except for f16/bf16 which accumulate in an f32 tile and
// round once in `store`. Elements are assumed aligned to their size. ----
using LoadFn = void (*)(void* acc, const void* in, size_t len);     // acc = widen(in); acc may == in
using CombineFn = void (*)(void* acc, const void* in, size_t len);  // acc = acc op widen(in)
using DivideFn = void (*)(void* acc, size_t len, double divisor);   // acc /= divisor
using StoreFn = void (*)(void* out, const void* acc, size_t len);   // out = round(acc)

struct TileKernels {
  LoadFn load = nullptr;
  CombineFn combine = nullptr;
  DivideFn divide = nullptr;  // floating-point dtypes only
  StoreFn store = nullptr;    // null when the accumulator is the output
};

// Defined in reduce_kernels_avx2.cc. True when the CPU has AVX2 and F16C
// (always false on non-x86 builds).
bool avx2Available();
// Replaces the entries of `k` that have an AVX2 version for (t, op); `op` is
// never kAvg here (AVG combines as SUM). The rest stay scalar.
void overlayAvx2Kernels(DataType t, ReduceOp op, TileKernels* k);

// The bits of the largest finite |src[i]| (0 if none): for non-negative
// floats their order is the integers' order, and an infinity or a NaN
// counts as 0. maxFiniteMagnitudeBits (reduce_kernels.h) picks one.
inline uint32_t maxFiniteMagnitudeBitsScalar(const float* src, size_t count) {
  uint32_t most = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(src[i]) & 0x7fffffffu;
    most = std::max(most, b < 0x7f800000u ? b : 0u);
  }
  return most;
}
uint32_t maxFiniteMagnitudeBitsAvx2(const float* src, size_t count);

}  // namespace smddp::reduce_internal
