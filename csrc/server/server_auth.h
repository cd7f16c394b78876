// Who may use a standalone reduction server (docs/design.md, "Security"):
// the servers and their workers share a key, from a file
// (SMDDP_SERVER_KEY_FILE, --key-file) or generated per job and handed out
// through the job's store. Each connection opens with a challenge and a
// response in both directions, under a key bound to the job and to the
// address the worker dialled, so neither side sends anything of value to a
// peer that has not proved it holds the key, serves this job and is the
// server the worker dialled (not a relay); unless SMDDP_SERVER_INTEGRITY=0
// every later frame also carries a MAC. Torch-free, over libcrypto
// (common/crypto.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/crypto.h"
#include "common/key_file.h"
#include "server/server_wire.h"
#include "transport/peer_seal.h"

namespace smddp {

// The key a worker proves itself with: the file's at SMDDP_SERVER_KEY_FILE
// when set, else `registered` (the job's key from the store the servers
// registered in) where SMDDP_SERVER_INSECURE=1 allows it (with a warning
// each time); otherwise an error that says how to give one.
std::string workerServerKey(const std::string& registered);
// SMDDP_SERVER_INSECURE: a key kept in the store is accepted.
bool serverInsecureParam();
// SMDDP_SERVER_INTEGRITY (on unless set to 0): a worker asks for a MAC on every
// frame; a server refuses workers that do not.
bool serverIntegrityParam();
// SMDDP_WIRE_ENCRYPT (off unless set to 1; wireEncryptParam() in
// transport/peer_seal.h, which encrypts the peer wire with it): every frame
// after the hello is encrypted too (AES-256-GCM, which implies its
// integrity); a worker and a server that disagree about it refuse each
// other, naming it.

// The key of one server's handshakes: the shared key bound to the job the
// server serves and to the address the worker dialled (endpointText). A
// relay (the worker dialled it, not the server), a host name that points
// elsewhere, or a server of another job holds the shared key but proves
// itself under another of these, so the worker refuses it.
std::string serverIdentityKey(std::string_view key, std::string_view job,
                              std::string_view address);
// "ip:port", or "[ip6]:port": the one spelling of an address both sides
// bind their key to (an IPv4-mapped IPv6 address is written as IPv4).
std::string endpointText(std::string ip, int port);
// A connected socket's own address (`local`) or its peer's, as
// endpointText writes it; "" if the socket has none.
std::string socketEndpoint(int fd, bool local);

// The stream's group as the servers see it: a one-way function of the
// group's secret, so a server (or anyone who reads its frames) learns
// nothing it could use against the group's own liveness or error frames.
uint64_t serverGroupId(uint64_t groupSecret);

constexpr size_t kNonceBytes = 32;
struct Nonce {
  uint8_t bytes[kNonceBytes] = {};
  static Nonce random();
};

// The proofs of one connection's handshake, under serverIdentityKey:
//   worker -> server  challenge: a fresh nonce Nw, an ephemeral X25519
//                     share Pw, the address it dialled and its job id
//   server -> worker  answer: a fresh nonce Ns, its share Ps, serverProof
//   worker -> server  hello (its header, then workerProof and the job id)
//   server -> worker  welcome, or an error
// Each proof is an HMAC-SHA256 under the key of a label, both nonces, both
// shares and, for the worker's, the hello it vouches for. The labels
// differ, so one side's proof never passes for the other's (a reflection);
// each side's own fresh nonce keeps a recorded exchange from being replayed
// to it; and a share swapped on the way (to read the session) breaks the
// proof. The session key also takes the X25519 secret of the two shares,
// which neither sends: one who holds the key and recorded the handshake
// (or steals the key later) still cannot derive it.
class Handshake {
 public:
  // `key`: serverIdentityKey's; the shares: each side's X25519 public key.
  Handshake(std::string_view key, const Nonce& worker, const Nonce& server,
            std::string_view workerShare, std::string_view serverShare)
      : key_(key), worker_(worker), server_(server), workerShare_(workerShare),
        serverShare_(serverShare) {}
  Mac serverProof() const;
  // `hello` as sent: its payload field counts the proof and the job id.
  Mac workerProof(const ServerFrame& hello, std::string_view job) const;
  // The key of this connection's frame MACs and ciphers, from `shared`,
  // the shares' X25519 secret (x25519SharedSecret).
  std::string sessionKey(std::string_view shared) const;

 private:
  std::string_view key_;
  Nonce worker_, server_;
  std::string_view workerShare_, serverShare_;
};

// Frame MACs on one connection in one direction: AES-256-GMAC under the
// connection's session key of the header and the payload, with the nonce
// the direction and a frame counter, sent right after the payload (16
// bytes). The counter makes a frame that was dropped, replayed or
// reordered fail the check, and keeps every nonce under a key distinct;
// the direction keeps a frame from being reflected back to its sender.
// GMAC, not HMAC, for the bulk: about 8.7 GB/s a core here against 1.6
// (docs/notes/2026-11-25-server-security.md).
// Encrypting (SMDDP_WIRE_ENCRYPT): AES-256-GCM of the payload under the
// same key and nonce, the header its additional authenticated data, so the
// tag covers both as before and the payload crosses as ciphertext.
enum class SealDirection : uint8_t { kToServer = 'W', kToWorker = 'S' };
class FrameSeal {
 public:
  FrameSeal(std::string sessionKey, SealDirection direction, bool encrypt = false)
      : key_(std::move(sessionKey)), direction_(direction), encrypt_(encrypt) {}
  bool encrypts() const { return encrypt_; }
  // The tag of the next frame in this direction (advances the counter).
  // MAC only: the payload is sent as it is.
  Tag next(const ServerFrame& header, const uint8_t* payload);
  // The next frame's tag; encrypting, its header.payload bytes from `in`
  // go to `out` as ciphertext (they may be the same buffer), else `out`
  // is unused (the payload goes as it is).
  Tag seal(const ServerFrame& header, const uint8_t* in, uint8_t* out);
  // Whether the next frame's `tag` checks; encrypting, its payload is
  // decrypted in place (garbage, to be dropped, when it does not check).
  bool open(const ServerFrame& header, uint8_t* payload, const uint8_t* tag);

 private:
  void nextNonce(uint8_t* nonce);
  std::string key_;
  SealDirection direction_;
  bool encrypt_;
  uint64_t counter_ = 0;
};

}  // namespace smddp
