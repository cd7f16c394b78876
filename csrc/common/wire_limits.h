// Limits the wire's tags set, shared by those who make tags (transport/
// frame.h) and those who cut a collective into chunks (reduce/shard_plan.cc),
// so that the reduce layer needs nothing from the transport.
#pragma once

#include <cstdint>

namespace smddp {

// The tag's chunk field is 24 bits: a phase of one collective has at most
// this many chunks (makeTag throws past it; the shard plan refuses first).
constexpr uint32_t kMaxChunksPerPhase = 1u << 24;

}  // namespace smddp
