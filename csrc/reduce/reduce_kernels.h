// Reduce kernels used by the reduction servers: combine shards from several
// workers element-wise, always in the order given, so results are bitwise
// reproducible. AVX2 is picked at run time when the CPU has it; scalar code
// is the fallback and the oracle. f16/bf16 accumulate in f32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace smddp {

// out[i] = inputs[0][i] op inputs[1][i] op ... op inputs[n-1][i], evaluated
// strictly left to right. For AVG the sum is divided by `avgDivisor` at the
// end (in the accumulation precision). `out` may be exactly any one of the
// inputs (same base pointer); partial overlaps are not supported. n >= 1.
// Throws smddp::Error for an unsupported (op, dtype).
void reduceOrdered(void* out, const void* const* inputs, size_t n, size_t count,
                   DataType dtype, ReduceOp op, double avgDivisor = 1.0);

// dst[i] = dst[i] op src[i]. AVG behaves as SUM here (the caller divides
// once at the end with finishAverage).
void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// data[i] = data[i] / divisor, for AVG on floating-point dtypes.
void finishAverage(void* data, size_t count, DataType dtype, double divisor);

// f16/bf16 only: reduceOrdered's f32 accumulator, written to `out` without
// rounding (AVG sums here; the caller divides once). For partials that are
// reduced again (across hosts) before the one rounding at the end.
void reduceOrderedToFloat(float* out, const void* const* inputs, size_t n, size_t count,
                          DataType dtype, ReduceOp op);
// f16/bf16 only: out[i] = round(in[i]) (nearest, ties to even); `out` may be
// `in` itself (narrowing in place).
void narrowFromFloat(void* out, const float* in, size_t count, DataType dtype);

// The bits of the largest finite |src[i]|, 0 if there is none (infinities
// and NaNs count as 0); the wire form's scale (reduce/narrow_wire.h).
uint32_t maxFiniteMagnitudeBits(const float* src, size_t count);

// Which implementation reduceOrdered dispatches to ("avx2" or "scalar").
const char* reduceKernelIsa();
// Force the scalar path (tests compare the two); returns the previous value.
bool setForceScalarKernels(bool force);

}  // namespace smddp
