// The host segment's constructor on its failure paths: whatever it throws,
// it leaves no name in /dev/shm and no mapping behind. And its size: the
// geometry `python -m torch_smddp.info` holds /dev/shm against is the one a
// group opens, and a segment takes what that geometry says.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <tuple>

#include "common/error.h"
#include "engine/engine_config.h"
#include "hostpath/host_path.h"
#include "hostpath/host_segment.h"
#include "transport/bootstrap.h"

using namespace smddp;

namespace {

bool devShmHas(const std::string& part) {
  DIR* d = opendir("/dev/shm");
  if (!d) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).find(part) != std::string::npos) found = true;
  }
  closedir(d);
  return found;
}

bool mapped(const std::string& part) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(part) != std::string::npos) return true;
  }
  return false;
}

// The bytes of this process's mappings of files whose name holds `part`.
uint64_t mappedBytes(const std::string& part) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uint64_t total = 0;
  while (std::getline(maps, line)) {
    if (line.find(part) == std::string::npos) continue;
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    total += std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16) -
             std::stoull(line.substr(0, dash), nullptr, 16);
  }
  return total;
}

std::string uniqueName() {
  std::random_device rd;
  return "segtest-" + std::to_string(getpid()) + "-" + std::to_string(rd());
}

}  // namespace

TEST_CASE("a segment whose peer never maps it is unlinked and unmapped", "[host_segment]") {
  // Rank 0 of two creates the segment; rank 1 never arrives, so the
  // constructor times out after the segment exists.
  InMemoryBootstrap boot;
  const std::string name = uniqueName();
  bool threw = false;
  try {
    HostSegment seg(boot, 0, 2, 2, 4096, 2, name, std::chrono::milliseconds(300));
  } catch (const Error& e) {
    threw = true;
    CHECK(e.kind() == ErrorKind::kTimeout);
  }
  CHECK(threw);
  CHECK_FALSE(devShmHas(name));
  CHECK_FALSE(mapped(name));
}

TEST_CASE("a segment both ranks mapped leaves nothing behind once destroyed", "[host_segment]") {
  // The ordinary path: the name goes once both have mapped it, the mapping
  // with the object.
  InMemoryBootstrap boot;
  const std::string name = uniqueName();
  std::thread rank0([&] {
    try {
      HostSegment seg(boot, 0, 2, 2, 4096, 2, name, std::chrono::milliseconds(2000));
    } catch (const Error&) {
    }
  });
  bool threw = false;
  try {
    HostSegment seg(boot, 1, 2, 2, 4096, 2, name, std::chrono::milliseconds(2000));
  } catch (const Error&) {
    threw = true;
  }
  rank0.join();
  CHECK_FALSE(threw);  // both mapped: the ordinary path
  CHECK_FALSE(devShmHas(name));
  CHECK_FALSE(mapped(name));
}

TEST_CASE("a segment takes in /dev/shm what its geometry says", "[host_segment]") {
  // One rank, so the constructor returns with the mapping in place: its
  // size in /proc/self/maps is the oracle for bytesFor.
  InMemoryBootstrap boot;
  const std::string name = uniqueName();
  HostSegment seg(boot, 0, 1, 1, 8192, 3, name, std::chrono::milliseconds(2000));
  const uint64_t bytes = HostSegment::bytesFor(1, 1, 8192, 3);
  CHECK(mappedBytes(name) == bytes);
  // Each slot is one server's contribution from one rank or its result.
  CHECK(bytes - HostSegment::bytesFor(1, 1, 8192, 0) == 1 * (1 + 1) * 3 * 8192);
}

TEST_CASE("the host segment's geometry follows the layout and the SMDDP_* settings",
          "[host_segment]") {
  EngineConfig c;
  c.hostPath = true;
  const uint64_t control = HostSegment::bytesFor(8, 8, 131072, 0);
  // One host, no more ranks than cores: 128 KiB slots, 4 deep, a server per rank.
  SegmentGeometry g = hostSegmentGeometry(c, 8, 1, 16);
  CHECK(g.unused.empty());
  CHECK((g.servers == 8 && g.slotBytes == 131072 && g.depth == 4 && !g.deep));
  CHECK(g.bytes == control + 8ull * 9 * 4 * 131072);
  // Across hosts, or more ranks than cores: 256 KiB slots, 16 deep.
  for (auto [local, hosts, cores] : {std::tuple{8, 2, 16}, std::tuple{8, 1, 4}}) {
    g = hostSegmentGeometry(c, local, hosts, cores);
    CHECK((g.deep && g.slotBytes == 262144 && g.depth == 16));
    CHECK(g.bytes == control + 8ull * 9 * 16 * 262144);
  }
  // The settings that size it.
  c.serversPerNode = 2;
  HostPathConfig h;
  h.shmSlotBytes = 65536;
  h.shmDepth = 8;
  c.layers.set(h);
  g = hostSegmentGeometry(c, 8, 2, 16);
  CHECK((g.servers == 2 && g.slotBytes == 65536 && g.depth == 8));
  CHECK(g.bytes == control + 2ull * 9 * 8 * 65536);
  // Layouts that open none.
  CHECK(hostSegmentGeometry(c, 1, 1, 16).unused == "one rank");
  CHECK(hostSegmentGeometry(c, 1, 4, 16).unused == "one rank per host");
  CHECK(hostSegmentGeometry(c, 65, 1, 128).unused == "more than 64 ranks on a host");
  CHECK(hostSegmentGeometry(c, 1, 4, 16).bytes == 0);
  c.serverHosts = {ServerAddress{"10.0.0.1", 7000, "test"}};  // standalone servers keep it
  CHECK(hostSegmentGeometry(c, 1, 4, 16).unused.empty());
  c.hostPath = false;
  CHECK(hostSegmentGeometry(c, 8, 1, 16).unused == "SMDDP_SHM_ALLREDUCE=0");
}
