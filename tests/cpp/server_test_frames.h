// Test helpers shared by the standalone-server tests (test_server_wire.cc,
// test_standalone_server.cc).
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "server/server_wire.h"

namespace smddp {

// A data frame of `count` elements of `dt` (SUM), its payload length set.
inline ServerFrame dataFrame(uint64_t count, DataType dt = DataType::kFloat32) {
  ServerFrame f;
  f.kind = static_cast<uint8_t>(ServerFrameKind::kData);
  f.dtype = static_cast<uint8_t>(dt);
  f.op = static_cast<uint8_t>(ReduceOp::kSum);
  f.count = count;
  f.payload = count * elementSize(dt);
  return f;
}

}  // namespace smddp
