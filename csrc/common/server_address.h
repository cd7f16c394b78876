// Where a standalone reduction server listens, as the user or the store
// named it: a value type, so that the engine's configuration can carry the
// list without depending on the server library (server/server_wire.h
// parses SMDDP_SERVER_HOSTS into it).
#pragma once

#include <string>

namespace smddp {

struct ServerAddress {
  std::string host;  // as written
  int port = 0;
  std::string origin;  // where it was listed, for messages: "SMDDP_SERVER_HOSTS[1]"
};

}  // namespace smddp
