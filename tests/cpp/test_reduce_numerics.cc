// Reduce kernels at the edges of their number formats: f16/bf16 rounding
// over all bit patterns, NaN and infinities, signed zeros, integer wrap,
// bool, and where accumulation and rounding happen. Every check runs on
// both the AVX2 and the forced-scalar path; the oracle is reduce_reference.h.
#include <catch2/catch.hpp>

#include "reduce_reference.h"

using namespace reduce_ref;

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
