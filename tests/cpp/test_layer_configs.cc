// Each layer's own config (common/layer_configs.h): readEngineConfig reads
// the engine's, the algorithms' and the host path's SMDDP_* values into
// their own structs, which the EngineConfig carries; the host path's
// reader takes the fusion scheduler's part too; a struct never set reads as its
// defaults; the ring depth resolves in the algorithms, not the engine.
#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "algorithms/algorithms_config.h"
#include "common/error.h"
#include "common/layer_configs.h"
#include "env_override.h"
#include "hostpath/allreduce_paths.h"
#include "hostpath/fusion_scheduler.h"
#include "hostpath/host_path.h"

namespace {

using namespace smddp;

struct Plain {
  int x = 7;
};

}  // namespace

TEST_CASE("layer configs: set, get, unset and copies", "[config]") {
  LayerConfigs layers;
  CHECK(layers.get<Plain>().x == 7);  // never set: the defaults
  layers.set(Plain{3});
  CHECK(layers.get<Plain>().x == 3);
  LayerConfigs copy = layers;
  copy.set(Plain{5});
  CHECK(layers.get<Plain>().x == 3);  // a copy's change stays in the copy
  CHECK(copy.get<Plain>().x == 5);
  CHECK(layers.get<AlgorithmsConfig>().ringDepth == 0);
}

TEST_CASE("each layer's SMDDP_* values land in its own struct", "[config]") {
  EnvOverride ring("SMDDP_RING_DEPTH", "7");
  EnvOverride rounds("SMDDP_ROUNDS_MIN_BYTES", "1M");
  EnvOverride fusion("SMDDP_FUSION_BUFFER_BYTES", "2M");
  EnvOverride depth("SMDDP_SHM_DEPTH", "5");
  EnvOverride share("SMDDP_SERVER_SHARE", "40");
  EnvOverride small("SMDDP_SMALL_BYTES", "12K");
  EnvOverride streaming("SMDDP_STREAMING_STORE_BYTES", "8M");
  EnvOverride chunk("SMDDP_CHUNK_BYTES", "64K");
  const EngineConfig c = readEngineConfig();
  CHECK(c.chunkBytes == 65536);  // the engine's own
  const AlgorithmsConfig& a = algorithmsConfig(c);
  CHECK(a.ringDepth == 7);
  CHECK(a.roundsMinBytes == (1u << 20));
  CHECK(a.fusionBytes == (2u << 20));
  const HostPathConfig& h = hostPathConfig(c);
  CHECK(h.shmDepth == 5);             // readHostPathParams
  CHECK(h.serverSharePercent == 40);  // readHostPathParams
  CHECK(h.smallBytes == 12288);       // readFusionParams
  CHECK(h.streamingBytes == (8u << 20));
  // The host path's one reader takes the fusion scheduler's part too.
  EngineConfig again;
  readHostPathParams(again);
  CHECK(hostPathConfig(again).smallBytes == 12288);
  CHECK(hostPathConfig(again).shmDepth == 5);
}

TEST_CASE("the ring depth: SMDDP_RING_DEPTH, else 4 on one host and 2 across", "[config]") {
  EngineConfig c;
  CHECK(ringDepthFor(c, true) == 4);
  CHECK(ringDepthFor(c, false) == 2);
  AlgorithmsConfig a;
  a.ringDepth = 9;
  c.layers.set(a);
  CHECK(ringDepthFor(c, true) == 9);
  CHECK(ringDepthFor(c, false) == 9);
}

// A byte-count variable of the host path: `fallback` when unset, each of
// `accepted` read as its value, each of `rejected` refused naming it.
static void checkHostPathBytes(const char* name, uint64_t HostPathConfig::*field, uint64_t fallback,
                               std::initializer_list<std::pair<const char*, uint64_t>> accepted,
                               std::initializer_list<const char*> rejected) {
  CHECK(hostPathConfig(readEngineConfig()).*field == fallback);
  for (const auto& [text, value] : accepted) {
    EnvOverride set(name, text);
    CHECK(hostPathConfig(readEngineConfig()).*field == value);
  }
  for (const char* bad : rejected) {
    EnvOverride set(name, bad);
    try {
      readEngineConfig();
      FAIL(name << "=" << bad << " was accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(name) != std::string::npos);
    }
  }
}

TEST_CASE("SMDDP_EAGER_GATHER_BYTES: 256 KiB by default, 0 for none, at most 1 MiB", "[config]") {
  checkHostPathBytes("SMDDP_EAGER_GATHER_BYTES", &HostPathConfig::eagerBytes, 256u << 10,
                     {{"0", 0}, {"1M", 1u << 20}}, {"2M", "1048577", "-1", "lots"});
}

TEST_CASE("SMDDP_STAGE_BYTES: 64 MiB by default, 0 for none, else at least 1 MiB", "[config]") {
  checkHostPathBytes("SMDDP_STAGE_BYTES", &HostPathConfig::stageBytes, 64u << 20,
                     {{"0", 0}, {"1M", 1u << 20}}, {"4K", "1048575", "-1", "lots"});
}
