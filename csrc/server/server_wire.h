// The wire of the standalone reduction servers (docs/design.md, "Standalone
// reduction servers" and "Security"): one plain TCP connection per (host,
// stream, server), carrying fixed 64-byte headers, each followed by its
// payload (and, with SMDDP_SERVER_INTEGRITY, a MAC: server_auth.h). Both
// ends validate every header before they read a payload byte, with no
// arithmetic that can wrap. Torch-free; the server process
// (standalone_server.h) and the workers' links (server_link.h) share it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "common/crypto.h"
#include "common/dtype.h"
#include "common/server_address.h"
#include "reduce/shard_plan.h"

namespace smddp {

constexpr uint32_t kServerMagic = 0x56534d53;  // "SMSV" little-endian
// 3: data and result frames may be narrow; 4: a challenge names the
// address dialled and the job (server_auth.h, serverIdentityKey); 5: the
// challenge and the answer carry each side's X25519 share (forward secrecy).
constexpr uint16_t kServerVersion = 5;
// The largest payload either side accepts: a data piece is at most one
// shared-memory step (SMDDP_SHM_SLOT_BYTES <= 256 MiB); texts are short.
constexpr uint64_t kServerMaxPayload = 1ull << 28;
constexpr uint64_t kServerMaxText = 4096;
constexpr uint64_t kServerMaxJob = 256;      // bytes of SMDDP_SERVER_JOB in a hello or challenge
constexpr uint64_t kServerMaxAddress = 64;   // bytes of "ip:port" in a challenge
// The largest group a server serves, in hosts: a waiting stream holds a
// slot per host and every accept turn walks them, so a key holder's hello
// may not make the server hold 65535 (standalone_server.cc, admit). 4096
// hosts is past any group the rest of smddp is tested at.
constexpr uint16_t kServerMaxHosts = 4096;
constexpr uint64_t kServerProofBytes = 32;   // a challenge's nonce, a proof (HMAC-SHA256)
constexpr uint64_t kServerShareBytes = 32;   // an ephemeral X25519 public key
// An answer: the server's nonce, its share, its proof.
constexpr uint64_t kServerAnswerBytes = 2 * kServerProofBytes + kServerShareBytes;
constexpr uint8_t kServerFlagIntegrity = 1;  // hello: a MAC on every later frame
// Hello (with kServerFlagIntegrity): every later frame's payload encrypted
// too (SMDDP_WIRE_ENCRYPT); a welcome repeats it, the server agreeing.
constexpr uint8_t kServerFlagEncrypt = 4;
// Data and result frames: the payload is the narrow wire form of `count`
// f32 values (reduce/narrow_wire.h: a scale, then bf16 or f16 elements,
// dtype naming which), read back to f32, combined in f32 in host order
// and packed once (SMDDP_CROSS_HOST_DTYPE).
constexpr uint8_t kServerFlagNarrowWire = 2;

// A connection opens challenge, answer, hello, welcome (server_auth.h,
// Handshake); data and results follow.
enum class ServerFrameKind : uint8_t {
  kHello = 1,      // worker -> server: its proof (32 bytes), then the job id
  kWelcome = 2,    // server -> worker: the hello was accepted
  kData = 3,       // worker -> server: this host's partial of one piece
  kResult = 4,     // server -> worker: the piece reduced over every host
  kError = 5,      // either way: UTF-8 text, then the connection closes
  kBye = 6,        // worker -> server: the group shut down normally
  kChallenge = 7,  // worker -> server, first frame: its nonce (32 bytes), the
                   // address it dialled (`count` bytes, "ip:port"), its job id
  kAnswer = 8,     // server -> worker: its nonce, then its proof (64 bytes)
};

#pragma pack(push, 1)
struct ServerFrame {
  uint32_t magic = kServerMagic;
  uint16_t version = kServerVersion;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t flags = 0;       // hello, welcome: kServerFlagIntegrity, kServerFlagEncrypt;
                           // data, result: kServerFlagNarrowWire
  uint8_t reserved[2] = {0, 0};
  uint32_t divisor = 1;    // AVG: the group's size (the sum is divided once, here)
  uint64_t group = 0;      // which group the stream belongs to (serverGroupId)
  uint64_t seq = 0;        // the fusion batch's first sequence number
  uint64_t step = 0;       // the batch's step (chunk) this piece belongs to
  uint64_t count = 0;      // elements of the piece
  uint64_t payload = 0;    // bytes after the header
  // Hello only: the group's host count, this host, the stream (the host's
  // server index) and this server's index; a hello's `seq` is the sender's
  // global rank, its `count` the stream's largest piece in bytes (the
  // server refuses larger data frames) and its `step` how long, in ms, the
  // worker waits for the other hosts to join (an incomplete stream
  // expires after the longest such wait of its hosts).
  uint16_t hosts = 0;
  uint16_t host = 0;
  uint16_t stream = 0;
  uint16_t server = 0;
};
#pragma pack(pop)
static_assert(sizeof(ServerFrame) == 64, "ServerFrame is 64 bytes on the wire");

// What a receiver accepts: "" when `f` is well formed and of one of the
// `kinds`, else a sentence naming the first bad field. A data or result
// frame must name a known dtype and op that go together, and carry exactly
// count * elementSize bytes (checked by division, never by multiplication);
// with kServerFlagNarrowWire (its only flag) the dtype is bf16 or f16 and
// the payload kNarrowWireScaleBytes more.
std::string validateServerFrame(const ServerFrame& f, std::initializer_list<ServerFrameKind> kinds);

// Whether two data frames are the same piece of the same call (flags too).
std::string samePiece(const ServerFrame& a, const ServerFrame& b);

const char* toString(ServerFrameKind k);

// SMDDP_SERVER_HOSTS: "host:port,host:port,..." (a host may be a name or a
// numeric address; IPv6 in brackets). Throws an invalid-argument error
// naming the variable for anything else.
std::vector<ServerAddress> parseServerHosts(const std::string& spec);

// The share of each cross-host step the K standalone servers take
// together, in millionths. `percent` >= 0 is SMDDP_SERVER_SHARE; -1 (auto)
// balances the bytes on links of one speed: with host pieces of a and
// server pieces of b (H·a + K·b = S), a worker host sends S + (H-2)·a and
// a server H·b per step; equal at b = 2(H-1)·S / (H² + (H-2)·K), capped at
// S/K (docs/design.md, "Standalone reduction servers").
inline uint64_t serverShareMillionths(int hosts, int standalone, int percent) {
  if (standalone <= 0) return 0;
  if (percent >= 0) return static_cast<uint64_t>(std::min(percent, 100)) * 10000;
  const uint64_t H = static_cast<uint64_t>(hosts), K = static_cast<uint64_t>(standalone);
  const uint64_t num = 2 * K * (H - 1), den = H * H + (H - 2) * K;
  return num >= den ? 1000000 : num * 1000000 / den;
}

// The cross-host pieces of one step of `len` elements: the H hosts' own
// servers take pieces 0..H-1 (an even split of the first len - T
// elements), the K standalone servers pieces H..H+K-1 (an even split of
// the last T = len x share), leftovers rotating by `step`. Every host
// computes the same split.
inline Range crossHostPiece(uint64_t len, int hosts, int standalone, int piece, uint64_t step,
                            uint64_t shareMillionths) {
  const uint64_t toServers =
      standalone > 0 ? static_cast<uint64_t>((static_cast<unsigned __int128>(len) *
                                              std::min<uint64_t>(shareMillionths, 1000000)) /
                                             1000000)
                     : 0;
  const uint64_t toHosts = len - toServers;
  if (piece < hosts) return balancedShard(toHosts, hosts, piece, step);
  Range r = balancedShard(toServers, standalone, piece - hosts, step);
  r.offset += toHosts;
  return r;
}

}  // namespace smddp

namespace smddp {

class FrameSeal;  // server_auth.h

// Payload memory that sizing does not fill: a buffer for a frame announced
// as n bytes takes pages only as its bytes land in it (and costs no loop
// over n elements either, as a vector's default-initialising resize does
// in a debug build). It keeps what it has when it already holds n bytes.
class PayloadBuffer {
 public:
  void resize(uint64_t n) {
    if (n > capacity_) {
      data_ = std::make_unique_for_overwrite<uint8_t[]>(n);
      capacity_ = n;
    }
    size_ = n;
  }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  uint64_t size_ = 0, capacity_ = 0;
};

// Blocking I/O on a non-blocking TCP socket, in poll slices of at most
// 100 ms: `stop` is asked between slices and ends the wait early with its
// text when it returns one. Each returns "" once all `n` bytes moved, else
// why not: "closed" (the peer closed or reset the connection), "silent"
// (nothing it sent was answered within the socket's boundSilence, see
// transport/socket_address.h), "timed out", or stop's text. Sends never
// raise SIGPIPE.
using WaitCheck = std::function<std::string()>;
std::string writeAllBefore(int fd, const void* p, size_t n,
                           std::chrono::steady_clock::time_point deadline,
                           const WaitCheck& stop = nullptr);
std::string readAllBefore(int fd, void* p, size_t n, std::chrono::steady_clock::time_point deadline,
                          const WaitCheck& stop = nullptr);
// A header and its payload (error texts, handshake frames), and its MAC
// when `seal` is given (the payload encrypted if it encrypts); best effort.
std::string writeTextFrame(int fd, ServerFrame f, const std::string& text,
                           std::chrono::steady_clock::time_point deadline,
                           FrameSeal* seal = nullptr);

// Non-blocking frame I/O on one TCP socket, shared by both ends of the
// wire: the workers' links (server_link.cc) and the servers' event loops
// (standalone_server.cc). Each call moves what the socket takes and stops at
// the next frame boundary, so the caller acts on every frame (validates a
// header, picks where its payload goes, recycles a sent buffer) and never
// waits on the socket. kFailed sets `why`: "closed" (the peer closed the
// connection), "silent" (unacknowledged past TCP_USER_TIMEOUT, see
// boundSilence) or the socket's error.
enum class FrameIo {
  kAgain,   // the socket has nothing more to give or take now
  kHeader,  // reader: a header is in; validate it, then payloadTo()
  kDone,    // the frame is complete (reader) or all sent (writer)
  kFailed,
};

class FrameReader {
 public:
  // From now on every frame must end in the MAC `seal` expects (the
  // connection's frames to this end; SMDDP_SERVER_INTEGRITY): one that
  // does not fails the read, after its payload has landed in payloadTo's
  // memory (so a caller whose memory must not see unchecked bytes reads
  // into a buffer of its own, as ServerLinks does). An encrypting seal
  // (SMDDP_WIRE_ENCRYPT) decrypts the payload there in place once all of
  // it is in: until kDone that memory holds ciphertext.
  void checkWith(FrameSeal* seal) { seal_ = seal; }
  // Reads up to the next boundary. After kHeader the caller must call
  // payloadTo() before reading on if the header announces a payload; a
  // frame with no payload completes (kDone) on the next call.
  FrameIo read(int fd, std::string* why);
  const ServerFrame& header() const { return header_; }
  void payloadTo(void* dst) { payload_ = static_cast<uint8_t*>(dst); }
  // After kDone, or to drop a frame half read: the next read starts a frame.
  void next() {
    got_ = 0;
    payload_ = nullptr;
  }
  bool idle() const { return got_ == 0; }  // between frames
  uint64_t bytes() const { return bytes_; }  // read so far, all frames

 private:
  ServerFrame header_;
  uint8_t* payload_ = nullptr;
  FrameSeal* seal_ = nullptr;
  uint8_t mac_[kTagBytes] = {};
  uint64_t got_ = 0;    // of header + payload (+ MAC)
  uint64_t bytes_ = 0;
};

// Reads one whole frame of one of `kinds` with a payload of at most `most`
// bytes into `payload`, blocking until `deadline` (handshakes, an error's
// text). "" or why not: the validator's sentence, or the socket's.
std::string readFrameBefore(int fd, FrameReader& reader,
                            std::initializer_list<ServerFrameKind> kinds, uint64_t most,
                            std::string* payload, std::chrono::steady_clock::time_point deadline);

class FrameWriter {
 public:
  // From now on every frame ends in its MAC under `seal`, computed when
  // its first byte goes out (SMDDP_SERVER_INTEGRITY). An encrypting seal
  // encrypts the payload then, into a buffer of the writer's own (one
  // frame is begun at a time), leaving the caller's memory as it was.
  void sealWith(FrameSeal* seal) { seal_ = seal; }
  // Queues a header and its payload: `data` (f.payload bytes) must stay
  // valid until the frame is sent; `keep`, if given, holds it and comes
  // back from pop().
  void push(const ServerFrame& f, const void* data,
            std::shared_ptr<PayloadBuffer> keep = nullptr) {
    out_.push_back({f, static_cast<const uint8_t*>(data), 0, std::move(keep), false, {}});
  }
  // Sends the front frame; kDone once it is all sent (pop() it), kAgain
  // when the socket is full or nothing is queued.
  FrameIo write(int fd, std::string* why);
  std::shared_ptr<PayloadBuffer> pop() {
    auto keep = std::move(out_.front().keep);
    out_.pop_front();
    return keep;
  }
  bool empty() const { return out_.empty(); }
  size_t size() const { return out_.size(); }
  const ServerFrame& front() const { return out_.front().header; }
  void clear() { out_.clear(); }
  uint64_t bytes() const { return bytes_; }  // sent so far, all frames
  // Blocking, best effort: sends the rest of a frame already begun, so
  // that a frame written next (an error) starts on a frame boundary.
  // "" if the stream is on a boundary now.
  std::string finishBefore(int fd, std::chrono::steady_clock::time_point deadline);

 private:
  struct Out {
    ServerFrame header;
    const uint8_t* data = nullptr;
    uint64_t sent = 0;  // of header + payload (+ MAC)
    std::shared_ptr<PayloadBuffer> keep;
    bool sealed = false;  // mac holds its tag (computed once, as it begins)
    uint8_t mac[kTagBytes];
  };
  // The frame's length on the wire; seals it when it has not begun.
  uint64_t begin(Out& o);
  std::deque<Out> out_;
  FrameSeal* seal_ = nullptr;
  PayloadBuffer cipher_;  // the front frame's encrypted payload (SMDDP_WIRE_ENCRYPT)
  uint64_t bytes_ = 0;
};

}  // namespace smddp
