// AVX2 + F16C versions of the hot reduce kernels (f32, f64, f16, bf16 for
// SUM/MIN/MAX/PRODUCT plus AVG's divide; int32/int64 SUM). Only these
// functions are compiled for AVX2, chosen at run time, so the library still
// runs on older CPUs. Every lane does exactly what the scalar code does.
#include "reduce/reduce_kernels_internal.h"

#if defined(__x86_64__) || defined(__i386__)

#include <cpuid.h>
#include <immintrin.h>

// No "fma": without it the compiler cannot contract anything into an FMA, so
// rounding stays identical to the scalar path.
#define SMDDP_AVX2 __attribute__((target("avx2,f16c")))

namespace smddp::reduce_internal {
namespace {

// ---- Lanes: how 8 (or 4) elements are loaded and widened to the
// accumulator type, and how an accumulator vector is narrowed back. ----

struct F32Lane {
  using Storage = float;
  using Acc = float;
  using Vec = __m256;
  static constexpr size_t kWidth = 8;
  SMDDP_AVX2 static Vec loadAcc(const Acc* p) { return _mm256_loadu_ps(p); }
  SMDDP_AVX2 static void storeAcc(Acc* p, Vec v) { _mm256_storeu_ps(p, v); }
  SMDDP_AVX2 static Vec load(const Storage* p) { return _mm256_loadu_ps(p); }
  static Acc decode(Storage x) { return x; }
};

struct F64Lane {
  using Storage = double;
  using Acc = double;
  using Vec = __m256d;
  static constexpr size_t kWidth = 4;
  SMDDP_AVX2 static Vec loadAcc(const Acc* p) { return _mm256_loadu_pd(p); }
  SMDDP_AVX2 static void storeAcc(Acc* p, Vec v) { _mm256_storeu_pd(p, v); }
  SMDDP_AVX2 static Vec load(const Storage* p) { return _mm256_loadu_pd(p); }
  static Acc decode(Storage x) { return x; }
};

struct F16Lane : F32Lane {
  using Storage = uint16_t;
  SMDDP_AVX2 static __m256 load(const Storage* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  SMDDP_AVX2 static void store(Storage* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static float decode(Storage x) { return halfToFloat(x); }
  static Storage encode(float x) { return floatToHalf(x); }
};

struct BF16Lane : F32Lane {
  using Storage = uint16_t;
  SMDDP_AVX2 static __m256 load(const Storage* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // Same as floatToBf16: add 0x7FFF + lsb and truncate; NaNs keep their top
  // bits with the quiet bit set.
  SMDDP_AVX2 static void store(Storage* p, __m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i isNan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, isNan);
    // Every lane is <= 0xFFFF, so the saturating pack is a plain narrowing.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  static float decode(Storage x) { return bf16ToFloat(x); }
  static Storage encode(float x) { return floatToBf16(x); }
};

// ---- Vector ops, each paired with the scalar op used for tails. ----

struct SumV {
  using Scalar = SumOp;
  SMDDP_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  SMDDP_AVX2 static __m256d apply(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
};

struct ProductV {
  using Scalar = ProductOp;
  SMDDP_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  SMDDP_AVX2 static __m256d apply(__m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
};

// vminps(a, b) is `a < b ? a : b`: on equal values or any NaN it returns b.
// Patch those lanes to MinOp's rules: equal -> OR of the bits (so -0 wins),
// then a NaN b, then a NaN a (the first NaN operand wins).
struct MinV {
  using Scalar = MinOp;
  SMDDP_AVX2 static __m256 apply(__m256 a, __m256 b) {
    __m256 r = _mm256_min_ps(a, b);
    r = _mm256_blendv_ps(r, _mm256_or_ps(a, b), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    r = _mm256_blendv_ps(r, b, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  SMDDP_AVX2 static __m256d apply(__m256d a, __m256d b) {
    __m256d r = _mm256_min_pd(a, b);
    r = _mm256_blendv_pd(r, _mm256_or_pd(a, b), _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
    r = _mm256_blendv_pd(r, b, _mm256_cmp_pd(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_pd(r, a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
};

// Mirror image of MinV: equal -> AND of the bits (so +0 wins).
struct MaxV {
  using Scalar = MaxOp;
  SMDDP_AVX2 static __m256 apply(__m256 a, __m256 b) {
    __m256 r = _mm256_max_ps(a, b);
    r = _mm256_blendv_ps(r, _mm256_and_ps(a, b), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    r = _mm256_blendv_ps(r, b, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  SMDDP_AVX2 static __m256d apply(__m256d a, __m256d b) {
    __m256d r = _mm256_max_pd(a, b);
    r = _mm256_blendv_pd(r, _mm256_and_pd(a, b), _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
    r = _mm256_blendv_pd(r, b, _mm256_cmp_pd(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_pd(r, a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
};

// ---- Tile steps ----

template <class Lane, class V>
SMDDP_AVX2 void combineFloat(void* accv, const void* inv, size_t len) {
  auto* acc = static_cast<typename Lane::Acc*>(accv);
  const auto* in = static_cast<const typename Lane::Storage*>(inv);
  size_t i = 0;
  for (; i + Lane::kWidth <= len; i += Lane::kWidth) {
    Lane::storeAcc(acc + i, V::apply(Lane::loadAcc(acc + i), Lane::load(in + i)));
  }
  for (; i < len; ++i) acc[i] = V::Scalar::apply(acc[i], Lane::decode(in[i]));
}

template <class Lane>
SMDDP_AVX2 void loadWide(void* accv, const void* inv, size_t len) {
  auto* acc = static_cast<float*>(accv);
  const auto* in = static_cast<const uint16_t*>(inv);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(acc + i, Lane::load(in + i));
  for (; i < len; ++i) acc[i] = Lane::decode(in[i]);
}

template <class Lane>
SMDDP_AVX2 void storeNarrow(void* outv, const void* accv, size_t len) {
  auto* out = static_cast<uint16_t*>(outv);
  const auto* acc = static_cast<const float*>(accv);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) Lane::store(out + i, _mm256_loadu_ps(acc + i));
  for (; i < len; ++i) out[i] = Lane::encode(acc[i]);
}

template <class Lane>
SMDDP_AVX2 void divideFloat(void* accv, size_t len, double divisor) {
  using Acc = typename Lane::Acc;
  auto* acc = static_cast<Acc*>(accv);
  const Acc d = static_cast<Acc>(divisor);
  size_t i = 0;
  if constexpr (sizeof(Acc) == 4) {
    const __m256 dv = _mm256_set1_ps(d);
    for (; i + 8 <= len; i += 8) _mm256_storeu_ps(acc + i, _mm256_div_ps(_mm256_loadu_ps(acc + i), dv));
  } else {
    const __m256d dv = _mm256_set1_pd(d);
    for (; i + 4 <= len; i += 4) _mm256_storeu_pd(acc + i, _mm256_div_pd(_mm256_loadu_pd(acc + i), dv));
  }
  for (; i < len; ++i) acc[i] = acc[i] / d;
}

// Wrapping integer add: vpaddd / vpaddq wrap exactly like SumOp.
template <class T>
SMDDP_AVX2 void combineIntSum(void* accv, const void* inv, size_t len) {
  auto* acc = static_cast<T*>(accv);
  const auto* in = static_cast<const T*>(inv);
  constexpr size_t kWidth = 32 / sizeof(T);
  size_t i = 0;
  for (; i + kWidth <= len; i += kWidth) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i s = sizeof(T) == 4 ? _mm256_add_epi32(a, b) : _mm256_add_epi64(a, b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + i), s);
  }
  for (; i < len; ++i) acc[i] = SumOp::apply(acc[i], in[i]);
}

template <class Lane>
CombineFn floatCombine(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return combineFloat<Lane, SumV>;
    case ReduceOp::kProduct: return combineFloat<Lane, ProductV>;
    case ReduceOp::kMin: return combineFloat<Lane, MinV>;
    case ReduceOp::kMax: return combineFloat<Lane, MaxV>;
    default: return nullptr;
  }
}

template <class Lane>
void overlayFloat(ReduceOp op, TileKernels* k) {
  if (CombineFn c = floatCombine<Lane>(op)) k->combine = c;
  k->divide = divideFloat<Lane>;
}

template <class Lane>
void overlayNarrow(ReduceOp op, TileKernels* k) {
  overlayFloat<Lane>(op, k);
  k->load = loadWide<Lane>;
  k->store = storeNarrow<Lane>;
}

}  // namespace

bool avx2Available() {
  static const bool available = [] {
    // F16C via cpuid: older clang's __builtin_cpu_supports does not know it.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    __builtin_cpu_init();
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return available;
}

SMDDP_AVX2 uint32_t maxFiniteMagnitudeBitsAvx2(const float* src, size_t count) {
  // The magnitudes' bits are below 2^31, so the signed compare and max
  // order them as the scalar code's unsigned ones do.
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  __m256i most = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i b = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)), magnitude);
    most = _mm256_max_epi32(most, _mm256_and_si256(b, _mm256_cmpgt_epi32(inf, b)));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), most);
  uint32_t m = maxFiniteMagnitudeBitsScalar(src + i, count - i);
  for (uint32_t v : lanes) m = std::max(m, v);
  return m;
}

void overlayAvx2Kernels(DataType t, ReduceOp op, TileKernels* k) {
  switch (t) {
    case DataType::kFloat32: overlayFloat<F32Lane>(op, k); break;
    case DataType::kFloat64: overlayFloat<F64Lane>(op, k); break;
    case DataType::kFloat16: overlayNarrow<F16Lane>(op, k); break;
    case DataType::kBFloat16: overlayNarrow<BF16Lane>(op, k); break;
    case DataType::kInt32:
      if (op == ReduceOp::kSum) k->combine = combineIntSum<int32_t>;
      break;
    case DataType::kInt64:
      if (op == ReduceOp::kSum) k->combine = combineIntSum<int64_t>;
      break;
    default: break;
  }
}

}  // namespace smddp::reduce_internal

#else  // not x86: scalar kernels only

namespace smddp::reduce_internal {
bool avx2Available() { return false; }
void overlayAvx2Kernels(DataType, ReduceOp, TileKernels*) {}
uint32_t maxFiniteMagnitudeBitsAvx2(const float* src, size_t count) {
  return maxFiniteMagnitudeBitsScalar(src, count);
}
}  // namespace smddp::reduce_internal

#endif
