// The harness of the transport tests: forked children that each own a
// Fabric and an Endpoint, closed-form payload patterns, and the checks
// of what arrived. Shared by test_transport.cc and test_transport_flow.cc;
// see test_transport.cc for why every endpoint lives in its own process.
#pragma once


#include <rdma/fi_errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/bootstrap.h"
#include "transport/endpoint.h"
#include "transport/fabric.h"
#include "transport/frame.h"
#include "transport/spare_endpoints.h"
#include "fork_children.h"

namespace transport_test {


using namespace smddp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kSecret = 0xfeedf00d12345678ULL;
constexpr size_t kHdr = sizeof(FrameHeader);
constexpr size_t kSinkBytes = 1 << 20;
constexpr uint8_t kUntouched = 0xa5;
const seconds kChildLimit(15);  // each wait inside a child
const seconds kHardDeadline(30);  // the parent kills children after this

// Byte i of message m: a mixed closed form, so no shift or swap of
// messages reproduces it.
inline uint8_t patternByte(uint64_t m, uint64_t i) {
  uint64_t x = i + m * 0x9e3779b97f4a7c15ULL;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

inline std::vector<uint8_t> patterned(uint64_t m, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = patternByte(m, i);
  return v;
}

// "" when buf[0, n) is message m's pattern starting at byte `from`.
inline std::string comparePattern(uint64_t m, const uint8_t* buf, size_t n, size_t from = 0) {
  for (size_t i = 0; i < n; ++i) {
    if (buf[i] != patternByte(m, from + i)) {
      return "message " + std::to_string(m) + " byte " + std::to_string(from + i) + " is " +
             std::to_string(buf[i]) + ", expected " + std::to_string(patternByte(m, from + i));
    }
  }
  return "";
}

inline CollectiveSignature sigFor(size_t bytes) {
  return {CollectiveType::kSendRecv, DataType::kUInt8, ReduceOp::kSum, bytes, -1};
}

// One operation in flight; libfabric owns `ctx` until its completion.
struct Op {
  fi_context2 ctx;
  uint64_t tag = 0;
  FrameHeader header{};
  std::vector<uint8_t> payload;  // with guard bytes past `bytes` on receives
  size_t bytes = 0;
  bool completed = false;  // set by Side when its completion is read
  bool done = false;       // set by a test once it has checked the completion
};

inline std::string describeTag(uint64_t t) {
  return "tag(class " + std::to_string(t >> 60) + ", seq " +
         std::to_string((t >> 28) & 0xffffffffULL) + ", phase " + std::to_string((t >> 24) & 0xf) +
         ", chunk " + std::to_string(t & 0xffffff) + ")";
}
constexpr size_t kGuard = 64;

// One process's side: its endpoint, the peer's address, a directory of
// flag files shared with the peer, and the completions seen so far.
class Side {
 public:
  Side(int rank, const std::string& dir, Endpoint& ep) : rank_(rank), dir_(dir), ep_(ep) {}

  void connect() {
    FileBootstrap boot(dir_);
    auto names = bootstrapAllGather(boot, rank_, 2, "addr", ep_.name(),
                                    std::chrono::duration_cast<milliseconds>(kChildLimit));
    auto addrs = ep_.insertPeers({names[1 - rank_], names[rank_]});
    peer = addrs[0];
    self = addrs[1];
  }

  // Ops live in a deque so their addresses stay put.
  Op& newOp() { return ops_.emplace_back(); }

  // Posts, and on -FI_EAGAIN progresses the CQ and retries.
  void send(Op& op, uint64_t tag, const void* payload, size_t bytes, uint64_t seq,
            uint32_t chunk, FrameKind kind = FrameKind::kData) {
    op.tag = tag;
    op.bytes = bytes;
    op.header = makeHeader(kind, kSecret, seq, rank_, chunk, 0, bytes, sigFor(bytes));
    iovec iov[2] = {{&op.header, kHdr}, {const_cast<void*>(payload), bytes}};
    retry([&] { return ep_.postSend(peer, tag, iov, bytes ? 2 : 1, &op.ctx); });
  }

  // A receive of exactly `bytes` payload bytes, plus the overflow sink.
  void recv(Op& op, fi_addr_t src, uint64_t tag, uint64_t ignore, size_t bytes) {
    op.tag = tag;
    op.bytes = bytes;
    op.payload.assign(bytes + kGuard, kUntouched);
    std::memset(&op.header, 0, sizeof(op.header));
    iovec iov[3];
    size_t n = 0;
    iov[n++] = {&op.header, kHdr};
    if (bytes) iov[n++] = {op.payload.data(), bytes};
    iov[n++] = {sink.data(), sink.size()};
    retry([&] { return ep_.postRecv(src, tag, ignore, iov, n, &op.ctx); });
  }

  void cancel(Op& op) { ep_.cancel(&op.ctx); }

  // Waits for `n` more completions; throws on timeout.
  std::vector<Completion> wait(size_t n) {
    auto deadline = Clock::now() + kChildLimit;
    while (done_.size() < n) {
      if (progress() == 0) {
        if (Clock::now() > deadline) {
          std::string open;
          for (const auto& op : ops_) {
            if (!op.completed) open += " " + describeTag(op.tag);
          }
          throw std::runtime_error("rank " + std::to_string(rank_) + " saw " +
                                   std::to_string(done_.size()) + " of " + std::to_string(n) +
                                   " completions before the deadline; still open:" + open);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    std::vector<Completion> out(done_.begin(), done_.begin() + static_cast<long>(n));
    done_.erase(done_.begin(), done_.begin() + static_cast<long>(n));
    return out;
  }

  // Polls for a while and returns whatever completed (for "nothing else
  // arrives" checks).
  std::vector<Completion> drain(milliseconds quiet) {
    auto until = Clock::now() + quiet;
    while (Clock::now() < until) {
      if (progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::vector<Completion> out(done_.begin(), done_.end());
    done_.clear();
    return out;
  }

  void setFlag(const std::string& key) { FileBootstrap(dir_).set(key, "1"); }
  bool hasFlag(const std::string& key) const {
    return access((dir_ + "/" + key).c_str(), F_OK) == 0;
  }
  // Waits for the peer's flag; `poll` progresses the endpoint meanwhile.
  void waitFlag(const std::string& key, bool poll = true) {
    auto deadline = Clock::now() + kChildLimit;
    while (!hasFlag(key)) {
      if (Clock::now() > deadline) throw std::runtime_error("no flag '" + key + "' from peer");
      if (poll) progress();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  // Both sides reach this point before either closes its endpoint.
  void barrier(const std::string& name) {
    setFlag(name + "." + std::to_string(rank_));
    waitFlag(name + "." + std::to_string(1 - rank_));
  }

  // Which op a completion belongs to.
  Op* opOf(const Completion& c) {
    for (auto& op : ops_) {
      if (c.context == &op.ctx) return &op;
    }
    return nullptr;
  }

  int rank() const { return rank_; }
  size_t eagains = 0;                  // -FI_EAGAIN returns seen by send()/recv()
  std::function<void()> onFirstEagain;  // runs once, inside the first retry
  fi_addr_t peer = FI_ADDR_UNSPEC;
  fi_addr_t self = FI_ADDR_UNSPEC;
  std::vector<uint8_t> sink = std::vector<uint8_t>(kSinkBytes, kUntouched);

 private:
  size_t progress() {
    Completion batch[16];
    size_t n = ep_.poll(batch, 16);
    for (size_t i = 0; i < n; ++i) {
      done_.push_back(batch[i]);
      if (Op* op = opOf(batch[i])) op->completed = true;
    }
    return n;
  }

  template <typename Post>
  void retry(Post post) {
    auto deadline = Clock::now() + kChildLimit;
    while (true) {
      int rc = post();
      if (rc == 0) return;
      if (rc != -FI_EAGAIN) throw std::runtime_error("post returned " + std::to_string(rc));
      if (eagains++ == 0 && onFirstEagain) onFirstEagain();
      if (Clock::now() > deadline) throw std::runtime_error("queue stayed full");
      progress();
    }
  }

  int rank_;
  std::string dir_;
  Endpoint& ep_;
  std::deque<Op> ops_;
  std::deque<Completion> done_;
};

using SideFn = std::function<std::string(Side&)>;
// How a child gets its endpoint; throws to fail the child.
using OpenFn = std::function<OpenedEndpoint(const std::string& provider, int rank)>;

// Forks rank 0 and rank 1, each with its own Fabric + Endpoint over
// `provider` (or from `open`), and returns their verdicts. A child that
// hangs past the hard deadline is killed and reported.
inline std::vector<std::string> runPair(const std::string& provider, const SideFn& rank0,
                                        const SideFn& rank1, const OpenFn& open = nullptr) {
  return smddp::test::runChildren(
      2,
      [&](int r, const std::string& dir) {
        // Never a spare: each test opens what it tests.
        OpenedEndpoint opened = open ? open(provider, r) : openFreshEndpoint(provider);
        Side side(r, dir, *opened.endpoint);
        side.connect();
        std::string result = (r == 0 ? rank0 : rank1)(side);
        // Nobody closes while the other still talks; a failed side only
        // signals, so its peer is not left waiting for it.
        if (result.empty()) side.barrier("end");
        else side.setFlag("end." + std::to_string(r));
        return result;
      },
      kHardDeadline);
}

// "" when `c` is the clean arrival of message `m` (tag, length, header,
// payload pattern, untouched guard and sink) into `op`.
inline std::string checkArrival(Side& side, const Completion& c, Op& op, uint64_t m, uint64_t seq) {
  std::string where = "message " + std::to_string(m) + " (" + std::to_string(op.bytes) +
                      " bytes): ";
  if (c.err != 0) return where + "error completion " + c.errText;
  if (c.tag != op.tag) return where + "completion tag differs from the posted tag";
  if (c.len != kHdr + op.bytes) {
    return where + "received " + std::to_string(c.len) + " bytes, expected " +
           std::to_string(kHdr + op.bytes);
  }
  std::string why;
  FrameExpectation e{kSecret, seq, static_cast<uint32_t>(1 - side.rank()), 2, op.bytes,
                     op.bytes, sigFor(op.bytes)};
  if (validateFrame(op.header, c.len, e, &why) != FrameVerdict::kOk) return where + why;
  if (op.header.chunk != m) return where + "header of chunk " + std::to_string(op.header.chunk);
  std::string bad = comparePattern(m, op.payload.data(), op.bytes);
  if (!bad.empty()) return where + bad;
  for (size_t i = 0; i < kGuard; ++i) {
    if (op.payload[op.bytes + i] != kUntouched) return where + "wrote past the payload iov";
  }
  if (side.sink[0] != kUntouched) return where + "spilled into the overflow sink";
  return "";
}

const char* const kProviders[] = {"shm", "tcp;ofi_rxm"};


}  // namespace transport_test
