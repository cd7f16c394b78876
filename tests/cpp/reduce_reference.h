// The reference the reduce-kernel tests check against: a plain per-element
// reduction written independently of the kernels (exact __int128 integer
// arithmetic, compiler _Float16 conversions, a nearest-candidate bf16
// rounder), input generators with special values, and small helpers.
// Shared by test_reduce_kernels.cc and test_reduce_numerics.cc.
#pragma once


#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "reduce/reduce_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace reduce_ref {

// splitmix64: a well-mixed 64-bit value of `x`, for inputs that depend on
// (rank, element) alone, so every rank can compute every other's.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// [0, 1) from the high 53 bits of `h`.
inline double unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }


using smddp::DataType;
using smddp::ReduceOp;
using Bytes = std::vector<uint8_t>;

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt8, DataType::kUInt8,
                              DataType::kInt32, DataType::kInt64, DataType::kBool};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

// Own tables, so a wrong entry in dtype.cc cannot hide behind itself.
inline const char* typeName(DataType t) {
  static const char* const kNames[] = {"float32", "float64", "float16", "bfloat16", "int8",
                                       "uint8", "int32", "int64", "bool"};
  return kNames[static_cast<int>(t)];
}
inline const char* opName(ReduceOp op) {
  static const char* const kNames[] = {"SUM", "AVG", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR"};
  return kNames[static_cast<int>(op)];
}
inline size_t sizeOf(DataType t) {
  static const size_t kSizes[] = {4, 8, 2, 2, 1, 1, 4, 8, 1};
  return kSizes[static_cast<int>(t)];
}
inline bool isFloat(DataType t) { return static_cast<int>(t) <= static_cast<int>(DataType::kBFloat16); }
inline bool isBitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}
inline bool expectSupported(ReduceOp op, DataType t) {
  if (isBitwise(op)) return !isFloat(t);
  if (op == ReduceOp::kAvg) return isFloat(t);
  return true;
}

struct ScopedIsa {
  explicit ScopedIsa(bool forceScalar) : previous(smddp::setForceScalarKernels(forceScalar)) {}
  ~ScopedIsa() { smddp::setForceScalarKernels(previous); }
  bool previous;
};

template <class T>
T get(const Bytes& b, size_t i) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void put(Bytes& b, size_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}

// ---- Oracle conversions: a binary float format decoded from its fields, and
// rounded by picking the nearer of the two neighbours (ties to even). ----

struct SmallFloat {
  int expBits;
  int mantBits;
  uint32_t signBit() const { return 1u << (expBits + mantBits); }
  uint32_t infBits() const { return ((1u << expBits) - 1) << mantBits; }
  // Value of the non-negative pattern m; m == infBits() gives 2^(emax+1).
  double magnitude(uint32_t m) const {
    const int bias = (1 << (expBits - 1)) - 1;
    const int exp = static_cast<int>(m >> mantBits);
    const int mant = static_cast<int>(m & ((1u << mantBits) - 1));
    if (exp == 0) return std::ldexp(mant, 1 - bias - mantBits);
    return std::ldexp((1 << mantBits) + mant, exp - bias - mantBits);
  }
  float decode(uint16_t b) const {
    const uint32_t m = b & (signBit() - 1);
    const double v = m == infBits()  ? std::numeric_limits<double>::infinity()
                     : m > infBits() ? std::numeric_limits<double>::quiet_NaN()
                                     : magnitude(m);
    return static_cast<float>((b & signBit()) ? -v : v);
  }
  uint16_t encode(float f) const {
    if (std::isnan(f)) return static_cast<uint16_t>(infBits() | (1u << (mantBits - 1)));
    const uint32_t sign = std::signbit(f) ? signBit() : 0;
    const double a = std::fabs(static_cast<double>(f));
    uint32_t lo = 0;  // largest pattern with magnitude(lo) <= a, by bisection
    uint32_t hi = infBits();
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      (magnitude(mid) <= a ? lo : hi) = mid;
    }
    if (a >= magnitude(hi)) lo = hi;  // at or beyond 2^(emax+1): infinity
    const double dLo = a - magnitude(lo);
    const double dHi = magnitude(lo + 1) - a;
    const uint32_t pick = lo == infBits() ? lo : dLo < dHi ? lo : dHi < dLo ? lo + 1 : ((lo & 1u) ? lo + 1 : lo);
    return static_cast<uint16_t>(sign | pick);
  }
};
constexpr SmallFloat kHalf{5, 10};
constexpr SmallFloat kBf16{8, 7};

inline float refHalfToFloat(uint16_t b) { return kHalf.decode(b); }
inline uint16_t refFloatToHalf(float f) { return kHalf.encode(f); }
inline float refBf16ToFloat(uint16_t b) { return kBf16.decode(b); }
inline uint16_t refFloatToBf16(float f) { return kBf16.encode(f); }

// ---- Oracle reduction ----

template <class F>
F refFloatOp(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<F>::quiet_NaN();
      if (a == b) {
        if (a != 0) return a;
        const bool neg = op == ReduceOp::kMin ? (std::signbit(a) || std::signbit(b))
                                              : (std::signbit(a) && std::signbit(b));
        return neg ? -F(0) : F(0);
      }
      return op == ReduceOp::kMin ? (a < b ? a : b) : (a > b ? a : b);
    }
    default: return a + b;  // SUM, AVG
  }
}

template <class T>
T wrapTo(__int128 v) {
  constexpr int kBits = 8 * sizeof(T);
  const unsigned __int128 mod = static_cast<unsigned __int128>(1) << kBits;
  const unsigned __int128 r = static_cast<unsigned __int128>(v) % mod;
  if (std::is_signed_v<T> && r >= mod / 2) {
    return static_cast<T>(static_cast<__int128>(r) - static_cast<__int128>(mod));
  }
  return static_cast<T>(r);
}

template <class T>
T refIntOp(ReduceOp op, T a, T b) {
  const __int128 x = a;
  const __int128 y = b;
  switch (op) {
    case ReduceOp::kSum: return wrapTo<T>(x + y);
    case ReduceOp::kProduct: return wrapTo<T>(x * y);
    case ReduceOp::kMin: return a < b ? a : b;
    case ReduceOp::kMax: return a > b ? a : b;
    case ReduceOp::kBand: return static_cast<T>(a & b);
    case ReduceOp::kBor: return static_cast<T>(a | b);
    default: return static_cast<T>(a ^ b);
  }
}

template <class F, class Decode>
F refFoldFloat(ReduceOp op, const std::vector<Bytes>& ins, size_t i, double div, Decode decode) {
  F acc = decode(ins[0], i);
  for (size_t j = 1; j < ins.size(); ++j) acc = refFloatOp<F>(op, acc, decode(ins[j], i));
  if (op == ReduceOp::kAvg) acc = acc / static_cast<F>(div);
  return acc;
}

template <class T>
T refFoldInt(ReduceOp op, const std::vector<Bytes>& ins, size_t i) {
  T acc = get<T>(ins[0], i);
  for (size_t j = 1; j < ins.size(); ++j) acc = refIntOp<T>(op, acc, get<T>(ins[j], i));
  return acc;
}

// bool closed forms over the number of true inputs.
inline uint8_t refBool(ReduceOp op, const std::vector<Bytes>& ins, size_t i) {
  size_t trues = 0;
  for (const Bytes& in : ins) trues += in[i] != 0;
  switch (op) {
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand: return trues == ins.size();
    case ReduceOp::kBxor: return trues % 2;
    default: return trues > 0;
  }
}

inline Bytes reference(DataType t, ReduceOp op, const std::vector<Bytes>& ins, size_t count, double div) {
  Bytes out(count * sizeOf(t));
  auto f32 = [](const Bytes& b, size_t i) { return get<float>(b, i); };
  auto f64 = [](const Bytes& b, size_t i) { return get<double>(b, i); };
  auto f16 = [](const Bytes& b, size_t i) { return refHalfToFloat(get<uint16_t>(b, i)); };
  auto bf16 = [](const Bytes& b, size_t i) { return refBf16ToFloat(get<uint16_t>(b, i)); };
  for (size_t i = 0; i < count; ++i) {
    switch (t) {
      case DataType::kFloat32: put(out, i, refFoldFloat<float>(op, ins, i, div, f32)); break;
      case DataType::kFloat64: put(out, i, refFoldFloat<double>(op, ins, i, div, f64)); break;
      case DataType::kFloat16:
        put(out, i, refFloatToHalf(refFoldFloat<float>(op, ins, i, div, f16)));
        break;
      case DataType::kBFloat16:
        put(out, i, refFloatToBf16(refFoldFloat<float>(op, ins, i, div, bf16)));
        break;
      case DataType::kInt8: put(out, i, refFoldInt<int8_t>(op, ins, i)); break;
      case DataType::kUInt8: put(out, i, refFoldInt<uint8_t>(op, ins, i)); break;
      case DataType::kInt32: put(out, i, refFoldInt<int32_t>(op, ins, i)); break;
      case DataType::kInt64: put(out, i, refFoldInt<int64_t>(op, ins, i)); break;
      default: out[i] = refBool(op, ins, i); break;
    }
  }
  return out;
}

inline double decodeAsDouble(DataType t, const Bytes& b, size_t i) {
  switch (t) {
    case DataType::kFloat32: return get<float>(b, i);
    case DataType::kFloat64: return get<double>(b, i);
    case DataType::kFloat16: return refHalfToFloat(get<uint16_t>(b, i));
    default: return refBf16ToFloat(get<uint16_t>(b, i));
  }
}

// Bitwise equality per element, except that any NaN matches any NaN (the
// oracle does not model NaN payloads). Returns "" or the first mismatch.
inline std::string firstMismatch(DataType t, const Bytes& got, const Bytes& want, size_t count) {
  const size_t es = sizeOf(t);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) == 0) continue;
    if (isFloat(t) && std::isnan(decodeAsDouble(t, got, i)) && std::isnan(decodeAsDouble(t, want, i))) {
      continue;
    }
    std::ostringstream os;
    os << "element " << i << ": got 0x" << std::hex;
    for (size_t k = es; k-- > 0;) os << static_cast<int>(got[i * es + k]);
    os << " want 0x";
    for (size_t k = es; k-- > 0;) os << static_cast<int>(want[i * es + k]);
    if (isFloat(t)) os << std::dec << " (" << decodeAsDouble(t, got, i) << " vs " << decodeAsDouble(t, want, i) << ")";
    return os.str();
  }
  return "";
}

// ---- Input generation ----

// Only the hardware default NaN is injected; arithmetic produces the same
// pattern, so NaN payloads cannot make the two ISAs differ spuriously.
inline void putSpecial(Bytes& b, DataType t, size_t i, std::mt19937_64& rng) {
  const float f32s[] = {0.f, -0.f, INFINITY, -INFINITY, std::bit_cast<float>(0xFFC00000u),
                        std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
                        std::numeric_limits<float>::denorm_min()};
  const double f64s[] = {0.0, -0.0, INFINITY, -INFINITY, std::bit_cast<double>(0xFFF8000000000000ull),
                         std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest(),
                         std::numeric_limits<double>::denorm_min()};
  const uint16_t f16s[] = {0x0000, 0x8000, 0x7C00, 0xFC00, 0xFE00, 0x7BFF, 0xFBFF, 0x0001};
  const uint16_t bf16s[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0xFFC0, 0x7F7F, 0xFF7F, 0x0001};
  const size_t k = rng() % 8;
  const bool randomBits = rng() % 2;
  switch (t) {
    case DataType::kFloat32: {
      const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
      put(b, i, randomBits ? (std::isnan(f) ? f32s[4] : f) : f32s[k]);
      break;
    }
    case DataType::kFloat64: {
      const double d = std::bit_cast<double>(static_cast<uint64_t>(rng()));
      put(b, i, randomBits ? (std::isnan(d) ? f64s[4] : d) : f64s[k]);
      break;
    }
    case DataType::kFloat16: {
      const auto h = static_cast<uint16_t>(rng());
      put(b, i, randomBits ? ((h & 0x7FFF) > 0x7C00 ? f16s[4] : h) : f16s[k]);
      break;
    }
    default: {
      const auto h = static_cast<uint16_t>(rng());
      put(b, i, randomBits ? ((h & 0x7FFF) > 0x7F80 ? bf16s[4] : h) : bf16s[k]);
      break;
    }
  }
}

// Moderate values (products stay near 1) plus a `wild` fraction of specials
// and random bit patterns for floating point.
inline Bytes randomInput(DataType t, ReduceOp op, size_t count, std::mt19937_64& rng, double wild) {
  Bytes b(count * sizeOf(t));
  std::uniform_real_distribution<double> any(-4.0, 4.0);
  std::uniform_real_distribution<double> nearOne(0.5, 2.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (size_t i = 0; i < count; ++i) {
    if (!isFloat(t)) {
      const uint64_t bits = rng();
      std::memcpy(b.data() + i * sizeOf(t), &bits, sizeOf(t));
      if (t == DataType::kBool) b[i] = bits & 1;
      continue;
    }
    if (unit(rng) < wild) {
      putSpecial(b, t, i, rng);
      continue;
    }
    const double v = op == ReduceOp::kProduct ? nearOne(rng) * ((rng() & 1) ? -1 : 1) : any(rng);
    switch (t) {
      case DataType::kFloat32: put(b, i, static_cast<float>(v)); break;
      case DataType::kFloat64: put(b, i, v); break;
      case DataType::kFloat16: put(b, i, refFloatToHalf(static_cast<float>(v))); break;
      default: put(b, i, refFloatToBf16(static_cast<float>(v))); break;
    }
  }
  return b;
}

inline std::vector<const void*> pointers(const std::vector<Bytes>& ins) {
  std::vector<const void*> ptrs;
  for (const Bytes& b : ins) ptrs.push_back(b.data());
  return ptrs;
}

// Runs reduceOrdered with each input splatted over 19 elements (full vectors
// plus a tail for every lane width) on both ISAs; all 38 results must agree
// bit for bit. Returns the common result.
template <class T>
T reduceOne(DataType t, ReduceOp op, const std::vector<T>& values, double div = 1.0) {
  constexpr size_t kCount = 19;
  std::vector<std::vector<T>> ins(values.size());
  for (size_t j = 0; j < values.size(); ++j) ins[j].assign(kCount, values[j]);
  std::vector<const void*> ptrs;
  for (const auto& in : ins) ptrs.push_back(in.data());
  std::vector<T> results;
  for (bool scalar : {false, true}) {
    ScopedIsa isa(scalar);
    std::vector<T> out(kCount);
    smddp::reduceOrdered(out.data(), ptrs.data(), ptrs.size(), kCount, t, op, div);
    results.insert(results.end(), out.begin(), out.end());
  }
  for (const T& r : results) REQUIRE(std::memcmp(&r, &results[0], sizeof(T)) == 0);
  return results[0];
}

inline uint32_t bitsOf(float f) { return std::bit_cast<uint32_t>(f); }
inline uint64_t bitsOf(double d) { return std::bit_cast<uint64_t>(d); }
inline uint16_t h(float f) { return refFloatToHalf(f); }
inline uint16_t bf(float f) { return refFloatToBf16(f); }

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();


}  // namespace reduce_ref
