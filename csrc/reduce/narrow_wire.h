// The narrow wire form of f32 values crossing hosts (SMDDP_CROSS_HOST_DTYPE,
// docs/design.md, "Compression between hosts"): a 4-byte f32 scale, a power
// of two, then `count` bf16 or f16 elements, each round(x * scale) (nearest,
// ties to even). Reading divides by the scale again, exactly.
//
// The scale keeps f16 from overflowing: it maps the largest finite |x| of
// the piece into [2^14, 2^15), so no finite value rounds to infinity, and
// small pieces keep f16's 11 significant bits instead of sinking into its
// subnormals. bf16 has f32's exponent range and is scaled only where a
// value would round past bf16's largest (|x| >= 2^127). Infinities and
// NaNs cross as themselves; a finite value within half a wire ulp of f32's
// largest, which rounds up past it, reads back as f32's largest.
//
// Error per element, for a finite x whose piece has largest magnitude m:
// bf16: |read - x| <= 2^-8 |x| + 2^-134 (one rounding; the second term
//       only below f32's normal range);
// f16:  |read - x| <= 2^-11 |x| + 2^-39 m, for m >= 2^-112 (the second
//       term: half of f16's subnormal spacing, at the piece's scale).
#pragma once

#include <cstddef>
#include <string>

#include "common/dtype.h"

namespace smddp {

// The wire form's leading scale (an f32), in bytes.
constexpr size_t kNarrowWireScaleBytes = 4;

// Bytes of `count` elements in the wire form of `wire` (kBFloat16 or kFloat16):
// kNarrowWireScaleBytes + count * elementSize(wire).
size_t narrowWireBytes(size_t count, DataType wire);

// Floats of packNarrowWire's scratch: it scales a piece this many at a time.
constexpr size_t kNarrowWireScratch = size_t{1} << 16;

// Writes src[0..count) in the wire form to `dst` (narrowWireBytes bytes).
// `scratch` holds min(count, kNarrowWireScratch) floats for the scaled
// copy (f16, and bf16's rare scaled case).
void packNarrowWire(void* dst, const float* src, size_t count, DataType wire, float* scratch);

// Reads the wire form back: dst[i] = widen(element i) / scale. False, with
// nothing written, if the scale is not a power of two in [2^-126, 2^127]
// (not a piece packNarrowWire wrote).
[[nodiscard]] bool unpackNarrowWire(float* dst, const void* src, size_t count, DataType wire);

// out[i] = the n pieces' elements read back (as unpackNarrowWire) and
// combined by `op` in f32, strictly in order (reduceOrdered over the read
// values: the same bits; AVG divides by avgDivisor). When every scale is 1
// (bf16 nearly always) and the op is SUM, that is one pass over the wire
// bytes; otherwise each piece is read into `wide` (n * count floats) first.
// `out` may not overlap any piece. Returns -1, or the index of the first
// piece whose scale is invalid (then `out` is undefined).
[[nodiscard]] int reduceNarrowWire(float* out, const void* const* pieces, size_t n, size_t count,
                                   DataType wire, ReduceOp op, double avgDivisor, float* wide);
// The same for elements [first, first + count) of every piece (each piece
// still starts at its scale): `out` and `wide` (n * count floats) hold the
// range only, so a long piece is combined in chunks of bounded memory.
[[nodiscard]] int reduceNarrowWireRange(float* out, const void* const* pieces, size_t n,
                                        size_t first, size_t count, DataType wire, ReduceOp op,
                                        double avgDivisor, float* wide);

// The narrow-wire reduction, one server's step, and the only copy of it:
// the network-only path's rank servers, the hierarchy's host servers and
// the standalone servers all come here (through serveNarrowWire for the
// first two). The n pieces, each in the wire form, are read back and
// combined by `op` in f32 strictly in order into `sum` (count floats, as
// reduceNarrowWire), then `sum` is packed once into `result`
// (narrowWireBytes(count, wire) bytes). The pieces are read a range of
// kNarrowWireScratch elements at a time, so `scratch` holds
// (n + 1) x min(count, kNarrowWireScratch) floats whatever the count: a
// standalone server's memory stays bounded. `result` may be one of the
// pieces (it is written after the last read); `sum` and `scratch` may not
// overlap any. Returns -1, or the index of the first piece whose scale is
// invalid (then `sum` and `result` are undefined).
[[nodiscard]] int combineNarrowWire(void* result, float* sum, const void* const* pieces, size_t n,
                                    size_t count, DataType wire, ReduceOp op, double avgDivisor,
                                    float* scratch);

// combineNarrowWire for a server that is also a contributor, its own
// contribution `own` in f32: `own` is packed into `ownWire` and taken as
// pieces[self] (so every contribution is rounded once, whichever rank
// serves it), the sum goes to `own` and is packed into `ownWire`, and `own`
// reads those bytes back, as every other rank does. `pieces[self]` is
// overwritten; the rest are the others' wire pieces. `scratch` as for
// combineNarrowWire. Returns -1, or the index of the first bad piece.
[[nodiscard]] int serveNarrowWire(float* own, void* ownWire, const void** pieces, size_t n,
                                  size_t self, size_t count, DataType wire, ReduceOp op,
                                  double avgDivisor, float* scratch);

// The error for a piece whose scale unpackNarrowWire refused (kMismatch):
// "smddp: <what> carries an invalid scale for bf16 (SMDDP_CROSS_HOST_DTYPE)",
// where `what` names the piece and its sender ("the cross-host partial from
// host 1 (rank 2)").
[[noreturn]] void throwInvalidWireScale(DataType wire, const std::string& what);

}  // namespace smddp
