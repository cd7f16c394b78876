// The algorithms' own tunables (readAllreduceParams, allreduce.cc), carried
// by the group's EngineConfig (common/layer_configs.h).
#pragma once

#include <cstdint>

#include "engine/engine_config.h"

namespace smddp {

struct AlgorithmsConfig {
  uint64_t minShardBytes = 0;   // SMDDP_MIN_SHARD_BYTES
  uint64_t minChunkBytes = 0;   // wire bytes; chunks shrink toward it for short shards
  int64_t ringDepth = 0;        // SMDDP_RING_DEPTH; 0: ringDepthFor decides
  int64_t roundsMinHosts = 0;   // pairwise rounds from this many hosts (0: never)
  uint64_t roundsMinBytes = 0;  // ... for calls at least this big
  uint64_t fusionBytes = 0;     // SMDDP_FUSION_BUFFER_BYTES: the fusion buffer's budget
};

inline const AlgorithmsConfig& algorithmsConfig(const EngineConfig& c) {
  return c.layers.get<AlgorithmsConfig>();
}

// The network path's receive ring, in chunks per peer: SMDDP_RING_DEPTH,
// or 4 on one host and 2 across hosts, where more only queue at the link
// (benchmarks/RESULTS.md, "The network path's ring across hosts").
inline int64_t ringDepthFor(const EngineConfig& c, bool oneHost) {
  const int64_t set = algorithmsConfig(c).ringDepth;
  return set > 0 ? set : (oneHost ? 4 : 2);
}

}  // namespace smddp
