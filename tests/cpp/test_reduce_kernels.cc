// Reduce kernels against independent oracles: a plain per-element reference
// written here (exact __int128 integer arithmetic, compiler _Float16
// conversions, a nearest-candidate bf16 rounder) and closed forms for edge
// values. Every check runs on both the AVX2 and the forced-scalar path.
#include <catch2/catch.hpp>

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
#include "engine/reduce_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace {

using smddp::DataType;
using smddp::ReduceOp;
using Bytes = std::vector<uint8_t>;

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt8, DataType::kUInt8,
                              DataType::kInt32, DataType::kInt64, DataType::kBool};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

// Own tables, so a wrong entry in dtype.cc cannot hide behind itself.
const char* typeName(DataType t) {
  static const char* const kNames[] = {"float32", "float64", "float16", "bfloat16", "int8",
                                       "uint8", "int32", "int64", "bool"};
  return kNames[static_cast<int>(t)];
}
const char* opName(ReduceOp op) {
  static const char* const kNames[] = {"SUM", "AVG", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR"};
  return kNames[static_cast<int>(op)];
}
size_t sizeOf(DataType t) {
  static const size_t kSizes[] = {4, 8, 2, 2, 1, 1, 4, 8, 1};
  return kSizes[static_cast<int>(t)];
}
bool isFloat(DataType t) { return static_cast<int>(t) <= static_cast<int>(DataType::kBFloat16); }
bool isBitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}
bool expectSupported(ReduceOp op, DataType t) {
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

float refHalfToFloat(uint16_t b) { return kHalf.decode(b); }
uint16_t refFloatToHalf(float f) { return kHalf.encode(f); }
float refBf16ToFloat(uint16_t b) { return kBf16.decode(b); }
uint16_t refFloatToBf16(float f) { return kBf16.encode(f); }

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
uint8_t refBool(ReduceOp op, const std::vector<Bytes>& ins, size_t i) {
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

Bytes reference(DataType t, ReduceOp op, const std::vector<Bytes>& ins, size_t count, double div) {
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

double decodeAsDouble(DataType t, const Bytes& b, size_t i) {
  switch (t) {
    case DataType::kFloat32: return get<float>(b, i);
    case DataType::kFloat64: return get<double>(b, i);
    case DataType::kFloat16: return refHalfToFloat(get<uint16_t>(b, i));
    default: return refBf16ToFloat(get<uint16_t>(b, i));
  }
}

// Bitwise equality per element, except that any NaN matches any NaN (the
// oracle does not model NaN payloads). Returns "" or the first mismatch.
std::string firstMismatch(DataType t, const Bytes& got, const Bytes& want, size_t count) {
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
void putSpecial(Bytes& b, DataType t, size_t i, std::mt19937_64& rng) {
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
Bytes randomInput(DataType t, ReduceOp op, size_t count, std::mt19937_64& rng, double wild) {
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

std::vector<const void*> pointers(const std::vector<Bytes>& ins) {
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

uint32_t bitsOf(float f) { return std::bit_cast<uint32_t>(f); }
uint64_t bitsOf(double d) { return std::bit_cast<uint64_t>(d); }
uint16_t h(float f) { return refFloatToHalf(f); }
uint16_t bf(float f) { return refFloatToBf16(f); }

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("every supported dtype x op matches the reference", "[reduce]") {
  for (bool scalar : {false, true}) {
    ScopedIsa isa(scalar);
    for (DataType t : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        if (!expectSupported(op, t)) continue;
        for (size_t n : {1, 2, 3, 5, 8}) {
          for (size_t count : {0, 1, 7, 31, 4097}) {
            // alias: -1 none, else `out` is exactly input `alias` (a server
            // reducing into its own buffer is input `rank`, not always 0).
            for (int alias : {-1, 0, 1, static_cast<int>(n) - 1}) {
              if (alias >= static_cast<int>(n)) continue;
              std::mt19937_64 rng(count * 1000003 + n * 101 + static_cast<size_t>(op) * 11 +
                                  static_cast<size_t>(t));
              std::vector<Bytes> ins;
              for (size_t j = 0; j < n; ++j) ins.push_back(randomInput(t, op, count, rng, 0.02));
              const double div = static_cast<double>(n);
              const Bytes want = reference(t, op, ins, count, div);
              // 16 guard elements past the end catch overruns.
              const size_t es = sizeOf(t);
              Bytes out((count + 16) * es, 0xCD);
              std::vector<const void*> ptrs = pointers(ins);
              if (alias >= 0) {
                if (count > 0) std::memcpy(out.data(), ins[alias].data(), count * es);
                ptrs[alias] = out.data();
              }
              smddp::reduceOrdered(out.data(), ptrs.data(), n, count, t, op, div);
              INFO((scalar ? "scalar " : "default ") << typeName(t) << " " << opName(op) << " n=" << n
                                                     << " count=" << count << " alias=" << alias);
              CHECK(firstMismatch(t, out, want, count) == "");
              CHECK(Bytes(out.begin() + count * es, out.end()) == Bytes(16 * es, 0xCD));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("AVX2 and forced-scalar paths agree bit for bit", "[reduce]") {
  {
    ScopedIsa isa(false);
    if (std::string(smddp::reduceKernelIsa()) != "avx2") {
      WARN("CPU lacks AVX2/F16C; only the scalar path exists here");
      return;
    }
  }
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (!expectSupported(op, t)) continue;
      for (size_t n : {1, 2, 5, 8}) {
        for (size_t count : {13, 2 * 4096 + 37}) {
          std::mt19937_64 rng(count + n * 7 + static_cast<size_t>(op) * 131 + static_cast<size_t>(t) * 17);
          std::vector<Bytes> ins;
          for (size_t j = 0; j < n; ++j) ins.push_back(randomInput(t, op, count, rng, 0.2));
          const std::vector<const void*> ptrs = pointers(ins);
          Bytes results[2];
          for (int scalar = 0; scalar < 2; ++scalar) {
            ScopedIsa isa(scalar == 1);
            results[scalar].assign(count * sizeOf(t), 0);
            smddp::reduceOrdered(results[scalar].data(), ptrs.data(), n, count, t, op, 3.0);
          }
          INFO(typeName(t) << " " << opName(op) << " n=" << n << " count=" << count);
          CHECK(results[0] == results[1]);
        }
      }
    }
  }
}

TEST_CASE("f16 and bf16 round once, to nearest even, over all bit patterns", "[reduce]") {
  SECTION("every f16 and bf16 value survives the f32 round trip") {
    for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
      for (bool scalar : {false, true}) {
        ScopedIsa isa(scalar);
        Bytes in(65536 * 2);
        for (uint32_t v = 0; v < 65536; ++v) put(in, v, static_cast<uint16_t>(v));
        Bytes out(in.size());
        const void* ptrs[] = {in.data()};
        smddp::reduceOrdered(out.data(), ptrs, 1, 65536, t, ReduceOp::kSum);
        INFO(typeName(t) << (scalar ? " scalar" : " default"));
        CHECK(firstMismatch(t, out, in, 65536) == "");
        for (uint32_t v = 0; v < 65536; ++v) {  // NaNs keep their sign
          if ((get<uint16_t>(out, v) & 0x8000) != (v & 0x8000)) FAIL("sign lost at " << v);
        }
      }
    }
  }
  SECTION("random bit patterns, including subnormals, inf and NaN") {
    for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
        for (size_t n : {2, 3}) {
          std::mt19937_64 rng(static_cast<size_t>(op) * 7 + n + static_cast<size_t>(t) * 1000);
          const size_t count = 20000;
          std::vector<Bytes> ins;
          for (size_t j = 0; j < n; ++j) {
            Bytes b(count * 2);
            for (size_t i = 0; i < count; ++i) put(b, i, static_cast<uint16_t>(rng()));
            ins.push_back(b);
          }
          const Bytes want = reference(t, op, ins, count, 3.0);
          for (bool scalar : {false, true}) {
            ScopedIsa isa(scalar);
            Bytes out(count * 2);
            smddp::reduceOrdered(out.data(), pointers(ins).data(), n, count, t, op, 3.0);
            INFO(typeName(t) << " " << opName(op) << " n=" << n << (scalar ? " scalar" : " default"));
            CHECK(firstMismatch(t, out, want, count) == "");
          }
        }
      }
    }
  }
}

#if defined(__FLT16_MAX__)
TEST_CASE("the f16 oracle agrees with the compiler's _Float16", "[reduce][oracle]") {
  for (uint32_t v = 0; v < 65536; ++v) {
    const float mine = refHalfToFloat(static_cast<uint16_t>(v));
    const float theirs = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(v)));
    if (std::isnan(mine) != std::isnan(theirs) || (!std::isnan(mine) && mine != theirs)) FAIL("decode " << v);
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns, and values concentrated around the f16 range.
    float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (i % 2) f = std::ldexp(static_cast<float>(rng() % (1u << 24)), static_cast<int>(rng() % 48) - 50);
    if (std::isnan(f)) continue;
    const uint16_t theirs = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    if (refFloatToHalf(f) != theirs) FAIL("encode " << f);
  }
}
#endif

TEST_CASE("NaN and infinities propagate", "[reduce]") {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    INFO(opName(op));
    // NaN first, in the middle and last.
    const std::vector<std::vector<float>> cases = {{kNaN, 1.f, 2.f}, {1.f, kNaN, -2.f}, {-1.f, 2.f, kNaN}};
    for (const std::vector<float>& v : cases) {
      CHECK(std::isnan(reduceOne<float>(DataType::kFloat32, op, v)));
      CHECK(std::isnan(reduceOne<double>(DataType::kFloat64, op, {v[0], v[1], v[2]})));
      CHECK(std::isnan(refHalfToFloat(reduceOne<uint16_t>(DataType::kFloat16, op, {h(v[0]), h(v[1]), h(v[2])}))));
      CHECK(std::isnan(refBf16ToFloat(reduceOne<uint16_t>(DataType::kBFloat16, op, {bf(v[0]), bf(v[1]), bf(v[2])}))));
    }
    // NaN beats infinity in MIN/MAX.
    CHECK(std::isnan(reduceOne<float>(DataType::kFloat32, op, {-kInf, kNaN})));
    CHECK(std::isnan(reduceOne<float>(DataType::kFloat32, op, {kNaN, kInf})));
  }
  CHECK(std::isnan(reduceOne<float>(DataType::kFloat32, ReduceOp::kSum, {kInf, -kInf})));
  CHECK(std::isnan(reduceOne<float>(DataType::kFloat32, ReduceOp::kProduct, {kInf, 0.f})));
  CHECK(reduceOne<float>(DataType::kFloat32, ReduceOp::kSum, {kInf, 1e30f, -3.f}) == kInf);
  CHECK(reduceOne<double>(DataType::kFloat64, ReduceOp::kMin, {1.0, -INFINITY, 2.0}) == -INFINITY);
  CHECK(reduceOne<double>(DataType::kFloat64, ReduceOp::kMax, {1.0, INFINITY, 2.0}) == INFINITY);
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kMax, {h(1), h(kInf)}) == 0x7C00);
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kMin, {bf(1), bf(-kInf)}) == 0xFF80);
  // A bf16 NaN keeps being a NaN through the f32 round trip, and its sign.
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0x7FC1}) == 0x7FC1);
  CHECK((reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kMax, {0xFF81}) & 0xFF80) == 0xFF80);
}

TEST_CASE("MIN/MAX order signed zeros as -0 < +0 regardless of operand order", "[reduce]") {
  CHECK(bitsOf(reduceOne<float>(DataType::kFloat32, ReduceOp::kMin, {0.f, -0.f})) == bitsOf(-0.f));
  CHECK(bitsOf(reduceOne<float>(DataType::kFloat32, ReduceOp::kMin, {-0.f, 0.f})) == bitsOf(-0.f));
  CHECK(bitsOf(reduceOne<float>(DataType::kFloat32, ReduceOp::kMax, {0.f, -0.f})) == bitsOf(0.f));
  CHECK(bitsOf(reduceOne<float>(DataType::kFloat32, ReduceOp::kMax, {-0.f, 0.f})) == bitsOf(0.f));
  CHECK(bitsOf(reduceOne<double>(DataType::kFloat64, ReduceOp::kMin, {0.0, -0.0, 0.0})) == bitsOf(-0.0));
  CHECK(bitsOf(reduceOne<double>(DataType::kFloat64, ReduceOp::kMax, {-0.0, 0.0, -0.0})) == bitsOf(0.0));
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kMin, {0x0000, 0x8000}) == 0x8000);
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kMax, {0x8000, 0x0000}) == 0x0000);
  // SUM follows IEEE: -0 + -0 = -0, -0 + +0 = +0.
  CHECK(bitsOf(reduceOne<float>(DataType::kFloat32, ReduceOp::kSum, {-0.f, -0.f})) == bitsOf(-0.f));
  CHECK(bitsOf(reduceOne<float>(DataType::kFloat32, ReduceOp::kSum, {-0.f, 0.f})) == bitsOf(0.f));
}

TEST_CASE("integer SUM and PRODUCT wrap modulo 2^bits", "[reduce]") {
  CHECK(reduceOne<int8_t>(DataType::kInt8, ReduceOp::kSum, {127, 1}) == -128);
  CHECK(reduceOne<int8_t>(DataType::kInt8, ReduceOp::kSum, {-128, -1}) == 127);
  CHECK(reduceOne<int8_t>(DataType::kInt8, ReduceOp::kProduct, {-128, -1}) == -128);
  CHECK(reduceOne<uint8_t>(DataType::kUInt8, ReduceOp::kSum, {255, 1}) == 0);
  CHECK(reduceOne<uint8_t>(DataType::kUInt8, ReduceOp::kProduct, {16, 16, 3}) == 0);
  CHECK(reduceOne<uint8_t>(DataType::kUInt8, ReduceOp::kProduct, {255, 255}) == 1);
  const int32_t i32max = std::numeric_limits<int32_t>::max();
  CHECK(reduceOne<int32_t>(DataType::kInt32, ReduceOp::kSum, {i32max, i32max}) == -2);
  CHECK(reduceOne<int32_t>(DataType::kInt32, ReduceOp::kProduct, {i32max, 2}) == -2);
  CHECK(reduceOne<int32_t>(DataType::kInt32, ReduceOp::kSum, {i32max, 1, 5}) == std::numeric_limits<int32_t>::min() + 5);
  const int64_t i64min = std::numeric_limits<int64_t>::min();
  CHECK(reduceOne<int64_t>(DataType::kInt64, ReduceOp::kSum, {i64min, -1}) == std::numeric_limits<int64_t>::max());
  CHECK(reduceOne<int64_t>(DataType::kInt64, ReduceOp::kProduct, {i64min, -1}) == i64min);
  CHECK(reduceOne<int64_t>(DataType::kInt64, ReduceOp::kProduct, {int64_t{1} << 32, int64_t{1} << 32}) == 0);
  // Closed forms: n inputs holding 1..n.
  for (int64_t n = 1; n <= 8; ++n) {
    std::vector<int32_t> v;
    for (int32_t k = 1; k <= n; ++k) v.push_back(k);
    CHECK(reduceOne<int32_t>(DataType::kInt32, ReduceOp::kSum, v) == n * (n + 1) / 2);
    CHECK(reduceOne<int32_t>(DataType::kInt32, ReduceOp::kMin, v) == 1);
    CHECK(reduceOne<int32_t>(DataType::kInt32, ReduceOp::kMax, v) == n);
  }
}

TEST_CASE("bool reduces logically and always yields 0 or 1", "[reduce]") {
  // Non-canonical true bytes (2, 0xFF) count as true.
  const std::vector<uint8_t> someTrue = {0, 2, 0xFF};
  const std::vector<uint8_t> allTrue = {1, 2, 0xFF};
  const std::vector<uint8_t> allFalse = {0, 0, 0};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kBor}) {
    INFO(opName(op));
    CHECK(reduceOne<uint8_t>(DataType::kBool, op, someTrue) == 1);
    CHECK(reduceOne<uint8_t>(DataType::kBool, op, allFalse) == 0);
  }
  for (ReduceOp op : {ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kBand}) {
    INFO(opName(op));
    CHECK(reduceOne<uint8_t>(DataType::kBool, op, someTrue) == 0);
    CHECK(reduceOne<uint8_t>(DataType::kBool, op, allTrue) == 1);
  }
  CHECK(reduceOne<uint8_t>(DataType::kBool, ReduceOp::kBxor, allTrue) == 1);     // three trues
  CHECK(reduceOne<uint8_t>(DataType::kBool, ReduceOp::kBxor, someTrue) == 0);    // two trues
  CHECK(reduceOne<uint8_t>(DataType::kBool, ReduceOp::kSum, {uint8_t{7}}) == 1);  // n == 1
}

TEST_CASE("f16 accumulates in f32 and rounds once at the end", "[reduce]") {
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {h(60000), h(60000)}) == 0x7C00);
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {h(-60000), h(-60000)}) == 0xFC00);
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kProduct, {h(300), h(300)}) == 0x7C00);
  // 65504 is the largest half; 65520 is the midpoint to 2^16 and ties to inf.
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {h(65504), h(8)}) == 0x7BFF);
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {h(65504), h(16)}) == 0x7C00);
  // The f32 intermediate (120000) overflows f16 but the average does not.
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kAvg, {h(60000), h(60000)}, 2.0) == h(60000));
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {h(60000), h(60000), h(-60000)}) == h(60000));
  // Subnormals: 2^-24 is 0x0001.
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {0x0001, 0x0001}) == 0x0002);
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {0x03FF, 0x0001}) == 0x0400);
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kAvg, {0x0001, 0x0000}, 2.0) == 0x0000);  // 2^-25 ties to 0
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kAvg, {0x0003, 0x0000}, 2.0) == 0x0002);  // 1.5 ulp ties to 2
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kAvg, {0x0001, 0x0001, 0x0001}, 3.0) == 0x0001);
  // 1 + 2^-11 is the midpoint between 1 and 1 + 2^-10: ties to even (1).
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {h(1), h(0x1p-11f)}) == 0x3C00);
  CHECK(reduceOne<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {h(1), h(0x1p-11f), h(0x1p-11f)}) == 0x3C01);
}

TEST_CASE("bf16 rounds ties to even, once, from the f32 accumulator", "[reduce]") {
  // bf16 has 7 mantissa bits: 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7.
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0x3F80, bf(0x1p-8f)}) == 0x3F80);
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0x3F81, bf(0x1p-8f)}) == 0x3F82);
  // Just above the midpoint rounds up; per-step rounding would give 1.0.
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0x3F80, bf(0x1p-8f), bf(0x1p-16f)}) == 0x3F81);
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0xBF80, bf(-0x1p-8f)}) == 0xBF80);
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0x7F7F, 0x7F7F}) == 0x7F80);
  // max + half an ulp (2^119) is the midpoint to 2^128 and ties to inf.
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0x7F7F, 0x7B00}) == 0x7F80);
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0x7F7F, 0x7A80}) == 0x7F7F);
}

TEST_CASE("AVG divides once, at the end, by avgDivisor", "[reduce]") {
  // Ten 1.0s: sum/10 is exactly 1, while summing 0.1f ten times is not.
  CHECK(reduceOne<float>(DataType::kFloat32, ReduceOp::kAvg, std::vector<float>(10, 1.f), 10.0) == 1.f);
  CHECK(reduceOne<double>(DataType::kFloat64, ReduceOp::kAvg, std::vector<double>(10, 1.0), 10.0) == 1.0);
  // The divisor need not be n.
  CHECK(reduceOne<float>(DataType::kFloat32, ReduceOp::kAvg, {3.f, 5.f}, 4.0) == 2.f);
  CHECK(reduceOne<double>(DataType::kFloat64, ReduceOp::kAvg, {1.0, 2.0, 4.0}, 7.0) == 1.0);
  CHECK(reduceOne<float>(DataType::kFloat32, ReduceOp::kAvg, {1.f, 2.f}, 3.0) == 1.f);
  CHECK(reduceOne<uint16_t>(DataType::kBFloat16, ReduceOp::kAvg, {bf(1), bf(2), bf(3)}, 3.0) == bf(2));
}

TEST_CASE("reduceInto and finishAverage", "[reduce]") {
  for (bool scalar : {false, true}) {
    ScopedIsa isa(scalar);
    INFO((scalar ? "scalar" : "default"));
    std::vector<float> dst(37, 1.5f);
    const std::vector<float> src(37, 2.f);
    smddp::reduceInto(dst.data(), src.data(), dst.size(), DataType::kFloat32, ReduceOp::kAvg);  // = SUM
    CHECK(dst == std::vector<float>(37, 3.5f));
    smddp::reduceInto(dst.data(), src.data(), dst.size(), DataType::kFloat32, ReduceOp::kMin);
    CHECK(dst == std::vector<float>(37, 2.f));
    smddp::finishAverage(dst.data(), dst.size(), DataType::kFloat32, 4.0);
    CHECK(dst == std::vector<float>(37, 0.5f));

    // f16 rounds after every reduceInto, since dst is f16.
    std::vector<uint16_t> hd(4099, h(1));
    const std::vector<uint16_t> hs(4099, h(0x1p-11f));
    smddp::reduceInto(hd.data(), hs.data(), hd.size(), DataType::kFloat16, ReduceOp::kSum);
    smddp::reduceInto(hd.data(), hs.data(), hd.size(), DataType::kFloat16, ReduceOp::kSum);
    CHECK(hd == std::vector<uint16_t>(4099, h(1)));
    smddp::finishAverage(hd.data(), hd.size(), DataType::kFloat16, 3.0);
    CHECK(hd == std::vector<uint16_t>(4099, h(1.f / 3.f)));

    std::vector<uint8_t> bd = {0, 1, 5, 0};
    const std::vector<uint8_t> bs = {0, 0, 0, 9};
    smddp::reduceInto(bd.data(), bs.data(), bd.size(), DataType::kBool, ReduceOp::kBor);
    CHECK(bd == std::vector<uint8_t>{0, 1, 1, 1});

    std::vector<int8_t> id = {127, -128, 3};
    const std::vector<int8_t> is = {1, -1, 4};
    smddp::reduceInto(id.data(), is.data(), id.size(), DataType::kInt8, ReduceOp::kSum);
    CHECK(id == std::vector<int8_t>{-128, 127, 7});
  }
}

TEST_CASE("unsupported combinations throw an Error naming op and dtype", "[reduce]") {
  auto expectInvalid = [](auto&& call, const std::string& op, const std::string& type) {
    try {
      call();
      FAIL("no exception for " << op << " on " << type);
    } catch (const smddp::Error& e) {
      CHECK(e.kind() == smddp::ErrorKind::kInvalidArgument);
      CHECK_THAT(std::string(e.what()), Catch::Contains(op) && Catch::Contains(type));
    }
  };
  size_t unsupported = 0;
  Bytes a(64), b(64), out(64);
  const void* ins[] = {a.data(), b.data()};
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (expectSupported(op, t)) continue;
      ++unsupported;
      INFO(typeName(t) << " " << opName(op));
      expectInvalid([&] { smddp::reduceOrdered(out.data(), ins, 2, 4, t, op); }, opName(op), typeName(t));
      expectInvalid([&] { smddp::reduceInto(out.data(), a.data(), 4, t, op); }, opName(op), typeName(t));
    }
    if (!isFloat(t)) {
      expectInvalid([&] { smddp::finishAverage(out.data(), 4, t, 2.0); }, "AVG", typeName(t));
    }
  }
  CHECK(unsupported == 4 * 3 + 5 * 1);  // bitwise on 4 float types, AVG on 5 others
  CHECK_THROWS_AS(smddp::reduceOrdered(out.data(), ins, 0, 4, DataType::kFloat32, ReduceOp::kSum), smddp::Error);
}

TEST_CASE("reduceKernelIsa reports the path and setForceScalarKernels toggles it", "[reduce]") {
  const bool before = smddp::setForceScalarKernels(true);
  CHECK(std::string(smddp::reduceKernelIsa()) == "scalar");
  CHECK(smddp::setForceScalarKernels(false) == true);
  const std::string isa = smddp::reduceKernelIsa();
  CHECK((isa == "avx2" || isa == "scalar"));
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  __builtin_cpu_init();
  CHECK((isa == "avx2") == (f16c && __builtin_cpu_supports("avx2")));
#endif
  smddp::setForceScalarKernels(before);
}
