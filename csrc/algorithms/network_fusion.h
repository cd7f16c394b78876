// Fusion on the network-only path (docs/design.md, "The allreduce path"):
// no shared segment holds a plan, so the ranks agree on a batch's cut by
// exchanging what each could fuse, riding on the batch's first call. The
// cut rule lives here, torch-free, so Catch2 can test it alone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "engine/allreduce_path.h"  // kMaxFusedCalls
#include "engine/engine_context.h"

namespace smddp {

// What one rank could fuse from a batch's first call: the consecutive
// allreduce calls already in its own queue (so issued there), same dtype
// and op, within SMDDP_FUSION_BUFFER_BYTES, stopping before a call whose
// memory overlaps an earlier one (an overlap fence) and before a call
// bigger than one chunk (SMDDP_CHUNK_BYTES), which runs alone. Sent as is.
struct CutProposal {
  uint32_t count = 0;  // calls, the first one included: 1 .. kMaxFusedCalls
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t pad[2] = {0, 0};
  uint64_t numel[kMaxFusedCalls] = {};
};

// The calls every rank fuses, given every rank's proposal (index = rank):
// the longest prefix that every proposal holds and on which they all agree,
// call by call. Every rank computes it from the same proposals, so the cut
// cannot diverge; a call on which ranks differ is left out and starts the
// next batch alone, where its own exchange reports the mismatch with both
// sides named. At least 1 (the first call, which runs in any case).
// Throws kProtocol naming the rank whose proposal is unreadable.
uint32_t agreedCut(const std::vector<CutProposal>& proposals);

// The network-only allreduce path that fuses queued calls: a batch starts
// with its first call, whose exchange carries every rank's proposal; the
// agreed cut's other calls are reduced as one buffer. `why` says why
// allreduce stays on the network, for the group's description.
std::unique_ptr<AllreducePath> openNetworkFusion(EngineContext& ctx, std::string why);

}  // namespace smddp
