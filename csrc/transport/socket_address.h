// Socket addresses as people read them. libfabric's tcp provider names an
// endpoint by its sockaddr; the liveness connections (peer_monitor.h) and
// `python -m torch_smddp.info` show and reuse that address.
#pragma once

#include <cstddef>
#include <string>

namespace smddp {

// The numeric IP of a socket address (sockaddr_in or sockaddr_in6 bytes),
// or "" when `bytes` is neither.
std::string numericAddress(const void* bytes, size_t len);

}  // namespace smddp
