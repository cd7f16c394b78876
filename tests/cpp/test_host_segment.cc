// The host segment's constructor on its failure paths: whatever it throws,
// it leaves no name in /dev/shm and no mapping behind.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "common/error.h"
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
