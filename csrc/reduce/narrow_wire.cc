#include "reduce/narrow_wire.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "reduce/reduce_kernels.h"

namespace smddp {

namespace {

constexpr size_t kScaleBytes = kNarrowWireScaleBytes;
static_assert(kScaleBytes == sizeof(float), "the scale is an f32");

void checkWire(DataType wire) {
  SMDDP_CHECK(wire == DataType::kBFloat16 || wire == DataType::kFloat16, kInternal,
              std::string("smddp: no narrow wire form for ") + toString(wire));
}

// The power of two that maps the largest finite magnitude where the wire
// type keeps it finite (see the header).
float chooseScale(const float* src, size_t count, DataType wire) {
  // The largest finite magnitude (AVX2 where there is one: the scalar
  // loop was the pack's main cost, 6x the narrowing itself).
  const uint32_t most = maxFiniteMagnitudeBits(src, count);
  float m;
  std::memcpy(&m, &most, sizeof(m));
  if (m == 0.0f) return 1.0f;
  int e = 0;
  std::frexp(m, &e);  // m < 2^e
  int se = wire == DataType::kFloat16 ? 15 - e : std::min(0, 127 - e);
  se = std::clamp(se, -126, 127);
  return std::ldexp(1.0f, se);
}

}  // namespace

size_t narrowWireBytes(size_t count, DataType wire) {
  checkWire(wire);
  return kScaleBytes + count * elementSize(wire);
}

void packNarrowWire(void* dst, const float* src, size_t count, DataType wire, float* scratch) {
  checkWire(wire);
  const float scale = chooseScale(src, count, wire);
  auto* out = static_cast<unsigned char*>(dst);
  std::memcpy(out, &scale, kScaleBytes);
  if (count == 0) return;
  if (scale == 1.0f) return narrowFromFloat(out + kScaleBytes, src, count, wire);
  // Scaled a chunk at a time through `scratch` (kNarrowWireScratch floats
  // at most): the scale is the whole piece's, so the bytes are the same.
  const size_t es = elementSize(wire);
  for (size_t i = 0; i < count; i += kNarrowWireScratch) {
    const size_t c = std::min(kNarrowWireScratch, count - i);
    for (size_t j = 0; j < c; ++j) scratch[j] = src[i + j] * scale;
    narrowFromFloat(out + kScaleBytes + i * es, scratch, c, wire);
  }
}

namespace {

// unpackNarrowWire for elements [first, first + count) of the piece at `src`.
bool unpackRange(float* dst, const void* src, size_t first, size_t count, DataType wire) {
  checkWire(wire);
  const auto* in = static_cast<const unsigned char*>(src);
  float scale;
  std::memcpy(&scale, in, kScaleBytes);
  int e = 0;
  if (!std::isfinite(scale) || std::frexp(scale, &e) != 0.5f || e < -125 || e > 128) return false;
  if (count == 0) return true;
  const void* elems = in + kScaleBytes + first * elementSize(wire);
  reduceOrderedToFloat(dst, &elems, 1, count, wire, ReduceOp::kSum);
  if (scale != 1.0f) {
    // A power of two: exact. Only a value within half a wire ulp of f32's
    // largest can round up past it; it reads back as the largest.
    const float inv = 1.0f / scale;
    const float most = std::numeric_limits<float>::max();
    for (size_t i = 0; i < count; ++i) {
      const float w = dst[i];
      const float v = w * inv;
      dst[i] = std::isinf(v) && !std::isinf(w) ? std::copysign(most, w) : v;
    }
  }
  return true;
}

}  // namespace

bool unpackNarrowWire(float* dst, const void* src, size_t count, DataType wire) {
  return unpackRange(dst, src, 0, count, wire);
}

int reduceNarrowWire(float* out, const void* const* pieces, size_t n, size_t count,
                     DataType wire, ReduceOp op, double avgDivisor, float* wide) {
  return reduceNarrowWireRange(out, pieces, n, 0, count, wire, op, avgDivisor, wide);
}

int reduceNarrowWireRange(float* out, const void* const* pieces, size_t n, size_t first,
                          size_t count, DataType wire, ReduceOp op, double avgDivisor,
                          float* wide) {
  checkWire(wire);
  bool unscaled = op == ReduceOp::kSum;
  for (size_t p = 0; p < n && unscaled; ++p) {
    float scale;
    std::memcpy(&scale, pieces[p], kScaleBytes);
    unscaled = scale == 1.0f;
  }
  if (unscaled) {
    // Widen and add in one pass: each piece's elements, as unpack reads
    // them with a scale of 1, summed in f32 in order, as reduceOrdered
    // sums the unpacked floats. n passes writing f32 and one more reading
    // them back cost the bf16 network path's servers most of their time.
    thread_local std::vector<const void*> elems;  // per chunk on a server: no allocation
    elems.resize(n);
    for (size_t p = 0; p < n; ++p) {
      elems[p] = static_cast<const unsigned char*>(pieces[p]) + kScaleBytes +
                 first * elementSize(wire);
    }
    if (count > 0) reduceOrderedToFloat(out, elems.data(), n, count, wire, ReduceOp::kSum);
    return -1;
  }
  thread_local std::vector<const void*> in;
  in.resize(n);
  for (size_t p = 0; p < n; ++p) {
    float* w = wide + p * count;
    if (!unpackRange(w, pieces[p], first, count, wire)) return static_cast<int>(p);
    in[p] = w;
  }
  if (count > 0) reduceOrdered(out, in.data(), n, count, DataType::kFloat32, op, avgDivisor);
  return -1;
}

int combineNarrowWire(void* result, float* sum, const void* const* pieces, size_t n,
                      size_t count, DataType wire, ReduceOp op, double avgDivisor,
                      float* scratch) {
  checkWire(wire);
  // Elementwise arithmetic: a range at a time gives the bits of one pass.
  const size_t chunk = std::max<size_t>(1, std::min(count, kNarrowWireScratch));
  float* wide = scratch + chunk;  // n x chunk floats; scratch[0, chunk) scales the pack
  // Once even for no elements: every scale is still checked.
  for (size_t i = 0; i == 0 || i < count; i += chunk) {
    const size_t c = std::min(chunk, count - i);
    const int bad = reduceNarrowWireRange(sum + i, pieces, n, i, c, wire, op, avgDivisor, wide);
    if (bad >= 0) return bad;
  }
  packNarrowWire(result, sum, count, wire, scratch);
  return -1;
}

int serveNarrowWire(float* own, void* ownWire, const void** pieces, size_t n, size_t self,
                    size_t count, DataType wire, ReduceOp op, double avgDivisor,
                    float* scratch) {
  packNarrowWire(ownWire, own, count, wire, scratch);
  pieces[self] = ownWire;
  const int bad = combineNarrowWire(ownWire, own, pieces, n, count, wire, op, avgDivisor, scratch);
  if (bad >= 0) return bad;
  SMDDP_CHECK(unpackNarrowWire(own, ownWire, count, wire), kInternal,
              "smddp: a narrow result did not read back");
  return -1;
}

void throwInvalidWireScale(DataType wire, const std::string& what) {
  throwError(ErrorKind::kMismatch, "smddp: " + what + " carries an invalid scale for " +
                                       toString(wire) + " (SMDDP_CROSS_HOST_DTYPE)");
}

}  // namespace smddp
