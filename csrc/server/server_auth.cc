#include "server/server_auth.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "common/unique_fd.h"
#include "transport/socket_address.h"

namespace smddp {

SMDDP_PARAM_BOOL(paramServerIntegrity, "SMDDP_SERVER_INTEGRITY", true,
                 "a MAC (AES-GMAC) on every frame to and from the standalone reduction servers "
                 "(workers ask for it; a server with it set refuses workers without it); 0 turns "
                 "it off, so that whoever can write into the TCP stream can change results")

SMDDP_PARAM_BOOL(paramServerInsecure, "SMDDP_SERVER_INSECURE", false,
                 "1 = let standalone reduction servers found in a store, with no key file, use "
                 "the job's key kept in that store, which anyone who reaches the store can read "
                 "and then pass as a server (a warning on every start); 0 refuses that")

bool serverInsecureParam() { return paramServerInsecure(); }
bool serverIntegrityParam() { return paramServerIntegrity(); }

std::string workerServerKey(const std::string& registered) {
  const std::string path = serverKeyFileParam();
  if (!path.empty()) return readServerKeyFile(path, "SMDDP_SERVER_KEY_FILE");
  if (!registered.empty()) {
    SMDDP_CHECK(paramServerInsecure(), kInvalidArgument,
                "the standalone reduction servers were found in the store with no key file "
                "(SMDDP_SERVER_KEY_FILE): their key would be the job's, kept in the store, which "
                "anyone who can reach the store can read and then pass as a server. Give the "
                "servers (--key-file) and the workers the same key file, or set "
                "SMDDP_SERVER_INSECURE=1 to accept the store's key");
    SMDDP_LOG(kWarn) << "smddp: SMDDP_SERVER_INSECURE=1: the standalone reduction servers use the "
                        "job's key from the store; whoever can reach the store can read it and "
                        "pass as a server (set SMDDP_SERVER_KEY_FILE to avoid this)";
    return registered;
  }
  throwError(ErrorKind::kInvalidArgument,
             "the standalone reduction servers (SMDDP_SERVER_HOSTS) need a key: set "
             "SMDDP_SERVER_KEY_FILE to the file the servers got with --key-file, or let them "
             "register in the job's store (--rendezvous, SMDDP_SERVER_COUNT) for a key "
             "generated per job");
}

uint64_t serverGroupId(uint64_t groupSecret) {
  return sha256Prefix64({"smddp server group v2", bytesOf(&groupSecret, sizeof(groupSecret))});
}

Nonce Nonce::random() {
  Nonce n;
  randomBytes(n.bytes, sizeof(n.bytes));
  return n;
}

std::string serverIdentityKey(std::string_view key, std::string_view job,
                              std::string_view address) {
  // Lengths first, so that no job id and address run into another pair.
  const uint64_t lengths[2] = {job.size(), address.size()};
  const Mac m = hmacSha256(key, {"smddp server v3: identity", bytesOf(lengths, sizeof(lengths)),
                                 job, address});
  return std::string(reinterpret_cast<const char*>(m.bytes), kMacBytes);
}

std::string endpointText(std::string ip, int port) {
  if (ip.rfind("::ffff:", 0) == 0 && ip.find('.') != std::string::npos) ip.erase(0, 7);
  if (ip.find(':') != std::string::npos) ip = "[" + ip + "]";
  return ip + ":" + std::to_string(port);
}

std::string socketEndpoint(int fd, bool local) {
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  auto* p = reinterpret_cast<sockaddr*>(&sa);
  if ((local ? getsockname(fd, p, &len) : getpeername(fd, p, &len)) != 0) return "";
  const std::string ip = numericAddress(&sa, len);
  if (ip.empty()) return "";
  const int port = sa.ss_family == AF_INET
                       ? ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port)
                       : ntohs(reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port);
  return endpointText(ip, port);
}

// Every part has a fixed length (the shares are checked to be
// kX25519Bytes before any proof is made), but for the job id, which comes
// last.
Mac Handshake::serverProof() const {
  return hmacSha256(key_, {"smddp server v5: server proof", bytesOf(worker_.bytes, kNonceBytes),
                           bytesOf(server_.bytes, kNonceBytes), workerShare_, serverShare_});
}

Mac Handshake::workerProof(const ServerFrame& hello, std::string_view job) const {
  return hmacSha256(key_, {"smddp server v5: worker proof", bytesOf(worker_.bytes, kNonceBytes),
                           bytesOf(server_.bytes, kNonceBytes), workerShare_, serverShare_,
                           bytesOf(&hello, sizeof(hello)), job});
}

std::string Handshake::sessionKey(std::string_view shared) const {
  const Mac m = hmacSha256(key_, {"smddp server v5: session", bytesOf(worker_.bytes, kNonceBytes),
                                  bytesOf(server_.bytes, kNonceBytes), workerShare_, serverShare_,
                                  shared});
  return std::string(reinterpret_cast<const char*>(m.bytes), kMacBytes);
}

void FrameSeal::nextNonce(uint8_t* nonce) {
  // The direction, three zero bytes, then the frame counter (little-endian).
  std::memset(nonce, 0, kGmacNonceBytes);
  nonce[0] = static_cast<uint8_t>(direction_);
  const uint64_t n = counter_++;
  std::memcpy(nonce + 4, &n, sizeof(n));
}

Tag FrameSeal::next(const ServerFrame& header, const uint8_t* payload) {
  uint8_t nonce[kGmacNonceBytes];
  nextNonce(nonce);
  return aesGmac(key_, nonce, {bytesOf(&header, sizeof(header)),
                               bytesOf(payload, payload ? header.payload : 0)});
}

Tag FrameSeal::seal(const ServerFrame& header, const uint8_t* in, uint8_t* out) {
  if (!encrypt_) return next(header, in);
  uint8_t nonce[kGmacNonceBytes];
  nextNonce(nonce);
  return aesGcmSeal(key_, nonce, bytesOf(&header, sizeof(header)), in, out,
                    in ? header.payload : 0);
}

bool FrameSeal::open(const ServerFrame& header, uint8_t* payload, const uint8_t* tag) {
  if (!encrypt_) return tagEquals(next(header, payload), tag);
  uint8_t nonce[kGmacNonceBytes];
  nextNonce(nonce);
  return aesGcmOpen(key_, nonce, bytesOf(&header, sizeof(header)), payload, payload,
                    payload ? header.payload : 0, tag);
}

}  // namespace smddp
