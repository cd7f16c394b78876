// A group's options and tunables. CommOptions come from the caller (rank,
// size, timeout, name); EngineConfig holds the engine's SMDDP_* values and
// carries every other layer's own struct without knowing it
// (common/layer_configs.h), all read once per group. Each layer reads its
// own, next to the code that uses them (the NCCL_PARAM pattern): the
// engine's here, the algorithms' (algorithms/algorithms_config.h) and the
// host path's (hostpath/host_path.h) above it;
// hostpath/allreduce_paths.h assembles them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/layer_configs.h"
#include "common/server_address.h"

namespace smddp {

// Standalone reduction servers found in a store (torch_smddp/__init__.py:
// registered by python -m torch_smddp.server --rendezvous), in place of
// SMDDP_SERVER_HOSTS, with the key generated for the job there.
struct RegisteredServers {
  std::vector<ServerAddress> hosts;
  std::string key;  // never logged
};

struct CommOptions {
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{300000};
  std::string name = "default";  // for messages and logs
  std::optional<RegisteredServers> servers;
  // The group's own SMDDP_CROSS_HOST_DTYPE (torch_smddp.Options); empty:
  // the variable decides.
  std::string crossHostDtype;
  // The process will form group after group (torchft's reconfigures;
  // c10d_smddp::GroupOptions::keepSpare): once formed, this group asks for
  // a spare endpoint for the next (transport/spare_endpoints.h).
  bool keepSpare = false;
};

struct EngineConfig {
  // engine/ (readEngineParams)
  uint64_t chunkBytes = 0;
  int64_t maxPostedRecvs = 0;
  int64_t spinUs = 0;
  int64_t sleepUs = 0;
  bool hostPath = false;       // allreduce through the host's shared memory segment
  int64_t serversPerNode = 0;  // reduction servers per host; 0 = every rank
  bool wireEncrypt = false;    // SMDDP_WIRE_ENCRYPT: seal data frames between hosts
  // The standalone reduction servers, as the engine places and checks them
  // (applyRegisteredServers); the host path's own server settings are in
  // its HostPathConfig.
  std::vector<ServerAddress> serverHosts;  // SMDDP_SERVER_HOSTS
  int64_t serverCount = 0;                 // SMDDP_SERVER_COUNT
  std::string serverKey;                   // the key a store handed out (else the key file)
  // What f32 partials cross hosts in: kFloat32, kBFloat16 or kFloat16
  // (SMDDP_CROSS_HOST_DTYPE, or the group's option; reduce/narrow_wire.h).
  DataType crossHostDtype = DataType::kFloat32;
  // The layers above: AlgorithmsConfig, HostPathConfig.
  LayerConfigs layers;
};

// "fp32", "bf16" or "fp16" (also float32, bfloat16, float16, half) as the
// wire type; anything else throws kInvalidArgument naming `source` (the
// variable or the option that held it). toString(DataType) names the
// result in a form it takes back.
DataType parseCrossHostDtype(const std::string& value, const std::string& source);

// The engine's own parameters: the engine thread's polling, the path
// choice, the servers per host (communicator.cc) and the exchange's wire
// chunking and posted receives (readExchangeParams, exchange.cc).
void readEngineParams(EngineConfig& c);
void readExchangeParams(EngineConfig& c);
// Servers a store handed out replace SMDDP_SERVER_HOSTS; then the lists
// must agree with SMDDP_SERVER_COUNT (engine_context.cc; the group's
// constructor calls it). Throws kInvalidArgument.
void applyRegisteredServers(EngineConfig& c, const std::optional<RegisteredServers>& servers);

}  // namespace smddp
