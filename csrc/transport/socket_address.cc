#include "transport/socket_address.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace smddp {

std::string numericAddress(const void* bytes, size_t len) {
  if (!bytes || len < sizeof(sa_family_t)) return "";
  sockaddr_storage sa{};
  std::memcpy(&sa, bytes, std::min(len, sizeof(sa)));
  socklen_t need = sa.ss_family == AF_INET ? sizeof(sockaddr_in)
                   : sa.ss_family == AF_INET6 ? sizeof(sockaddr_in6)
                                              : 0;
  if (need == 0 || len < need) return "";
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&sa), need, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

}  // namespace smddp
