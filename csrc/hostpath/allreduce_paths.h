// How a group's allreduce runs, chosen once at set-up by the layers above
// the engine: through each host's shared-memory segment when the layout
// allows (fusion_scheduler.h), else over libfabric only, fused
// (network_fusion.h) or plain (algorithms/allreduce.cc). The engine holds
// the result as an AllreducePath (engine/allreduce_path.h) and knows none
// of them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/allreduce_path.h"
#include "engine/communicator.h"
#include "engine/engine_config.h"
#include "engine/engine_context.h"
#include "transport/bootstrap.h"

namespace smddp {

// Every layer's SMDDP_* tunables, each read next to the code that uses it
// (engine, algorithms, host path, fusion scheduler). Throws kInvalidArgument
// naming a malformed variable.
EngineConfig readEngineConfig();

// The AllreducePathFactory of every group (collective over `bootstrap`):
// the host segment's scheduler when every host's segment opens, else the
// network-only path, fused when every rank fuses. `shmTrouble` gets why
// the segment was given up, for the group's one warning.
std::unique_ptr<AllreducePath> openAllreducePath(EngineContext& ctx, Bootstrap& bootstrap,
                                                 std::vector<std::string>& shmTrouble);

// What a Communicator needs from above the engine: readEngineConfig() and
// openAllreducePath (the backend's groups and the tests' worlds).
EngineParts standardEngineParts();

}  // namespace smddp
