#include "hostpath/host_collectives.h"

#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "algorithms/blocks.h"
#include "common/caller_waiting.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "engine/engine_context.h"
#include "engine/stall_watch.h"
#include "hostpath/fusion_batch.h"
#include "reduce/reduce_kernels.h"

namespace smddp {

SMDDP_PARAM_BOOL(paramShmCollectives, "SMDDP_SHM_COLLECTIVES", true,
                 "all-gather and reduce-scatter of a group whose ranks share one host read "
                 "each peer's buffer directly (process_vm_readv: one copy, no network); 0, or "
                 "a kernel that forbids those reads, sends them over the network")

namespace {

// Reduce-scatter reads the peers' parts in pieces of this many bytes, which
// stay in cache until the combine reads them.
constexpr uint64_t kPieceBytes = 256 * 1024;
// One process_vm_readv moves at most this much (the kernel's limit is
// about 2 GiB).
constexpr uint64_t kMaxReadBytes = uint64_t{1} << 30;

bool overlaps(const void* a, uint64_t aBytes, const void* b, uint64_t bBytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return aBytes > 0 && bBytes > 0 && x < y + bBytes && y < x + aBytes;
}

uint64_t address(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Reads `bytes` at `remote` in process `pid`; errno's text, or "".
std::string readProcess(pid_t pid, void* local, uint64_t remote, uint64_t bytes) {
  auto* dst = static_cast<uint8_t*>(local);
  while (bytes > 0) {
    const uint64_t len = std::min(bytes, kMaxReadBytes);
    iovec l{dst, len};
    iovec r{reinterpret_cast<void*>(remote), len};
    const ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? std::strerror(errno) : "nothing read";
    dst += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return "";
}

// Whether this rank can read rank `peer`'s probe word: "ok", or why not.
std::string probePeer(int rank, int peer, const std::string& theirs) {
  unsigned long long pid = 0, where = 0, value = 0;
  if (std::sscanf(theirs.c_str(), "%llu %llu %llu", &pid, &where, &value) != 3) {
    return "rank " + std::to_string(peer) + " sent an unreadable probe";
  }
  uint64_t seen = 0;
  std::string err = readProcess(static_cast<pid_t>(pid), &seen, where, sizeof(seen));
  if (err.empty() && seen != value) err = "read the wrong bytes";
  if (err.empty()) return "ok";
  std::string text = "rank " + std::to_string(rank) + " cannot read rank " + std::to_string(peer) +
                     "'s memory (process_vm_readv: " + err + ")";
  if (err == std::strerror(EPERM)) {
    text += "; with the Yama module, kernel.yama.ptrace_scope must be 0 for ranks to read "
            "each other";
  }
  return text;
}

}  // namespace

std::unique_ptr<SegmentCollectives> SegmentCollectives::open(EngineContext& ctx,
                                                             Bootstrap& bootstrap,
                                                             HostSegment& segment,
                                                             NotOpened* notOpened) {
  const int rank = ctx.rank();
  const int n = ctx.size();
  SMDDP_CHECK(n == segment.ranks(), kInternal, "host collectives need every rank on one host");
  // A word only this process knows, for a peer to read back.
  uint64_t word = 0;
  randomBytes(&word, sizeof(word));
  volatile uint64_t probe = word;
  const std::string mine =
      paramShmCollectives() ? std::to_string(getpid()) + " " +
                                  std::to_string(address(const_cast<uint64_t*>(&probe))) + " " +
                                  std::to_string(static_cast<uint64_t>(probe))
                            : "off";
  const auto timeout = ctx.waits().timeout();
  auto where = bootstrapAllGather(bootstrap, rank, n, "hostcoll/where", mine, timeout);
  std::string status = "ok";
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n && status == "ok"; ++r) {
    if (where[r] == "off") status = "off";
    else pids[r] = static_cast<pid_t>(std::strtoll(where[r].c_str(), nullptr, 10));
  }
  if (status == "ok") status = probePeer(rank, (rank + 1) % n, where[(rank + 1) % n]);
  // Every rank has read (or failed to) before any probe word goes away.
  auto votes = bootstrapAllGather(bootstrap, rank, n, "hostcoll/ok", status, timeout);
  for (const std::string& v : votes) {
    if (v == "ok") continue;
    notOpened->switchedOff = v == "off";
    notOpened->why = notOpened->switchedOff ? "SMDDP_SHM_COLLECTIVES=0" : v;
    return nullptr;
  }
  return std::unique_ptr<SegmentCollectives>(new SegmentCollectives(segment, rank, pids));
}

SegmentCollectives::SegmentCollectives(HostSegment& segment, int rank, std::vector<pid_t> pids)
    : segment_(segment), rank_(rank), ranks_(segment.ranks()), pids_(std::move(pids)) {}

std::string SegmentCollectives::describe() const {
  return "shared memory, each rank reading its peers' buffers (" + std::to_string(ranks_) +
         " ranks)";
}

void SegmentCollectives::post(uint64_t seq, const CollectiveSignature& sig,
                              const std::vector<uint64_t>& blocks) {
  DirectPost& p = segment_.ctl().direct[rank_];
  p.numel = sig.numel;
  p.collective = static_cast<uint8_t>(sig.collective);
  p.dtype = static_cast<uint8_t>(sig.dtype);
  p.op = static_cast<uint8_t>(sig.op);
  std::copy(blocks.begin(), blocks.end(), p.block);
  p.posted.store(seq + 1, std::memory_order_release);
  segment_.wakeAll();
}

void SegmentCollectives::await(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                               const CollectiveSignature& sig,
                               const std::function<bool(int)>& arrived) {
  using clock = std::chrono::steady_clock;
  const auto spin = std::chrono::microseconds(ctx.config().spinUs);
  const auto idleSince = clock::now();
  auto nextCheck = idleSince;
  auto behind = [&] {  // for messages
    std::vector<int> ranks;
    for (int p = 0; p < ranks_; ++p) {
      if (!arrived(p)) ranks.push_back(p);
    }
    return ranks;
  };
  while (true) {
    const uint32_t seen = segment_.wakeValue();
    int p = 0;
    while (p < ranks_ && arrived(p)) ++p;
    if (p == ranks_) return;
    if (ctx.waits().stopRequested()) {
      throwError(ErrorKind::kAborted, "smddp: " + watch.what() + ": the process group was shut down");
    }
    const auto now = clock::now();
    if (now >= nextCheck) {  // error frames, probes, the deadline, liveness
      nextCheck = now + std::chrono::microseconds(100);
      ctx.progress();
      watch.check(seq, &sig, 1, [&] { return rankList(behind()); },
                  [&] { return "not seen at this call: " + rankList(behind()); });
    }
    if (now - idleSince < spin && aCallerIsWaiting()) {
      if (!segment_.watchWake(seen)) sched_yield();
      continue;
    }
    segment_.sleep(seen, std::chrono::microseconds(2000));
  }
}

void SegmentCollectives::awaitPosts(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                                    const CollectiveSignature& sig) {
  SegmentControl& ctl = segment_.ctl();
  await(ctx, watch, seq, sig, [&](int p) {
    return ctl.direct[p].posted.load(std::memory_order_acquire) == seq + 1;
  });
  for (int p = 0; p < ranks_; ++p) {
    const DirectPost& d = ctl.direct[p];
    const CollectiveSignature theirs{static_cast<CollectiveType>(d.collective),
                                     static_cast<DataType>(d.dtype), static_cast<ReduceOp>(d.op),
                                     d.numel, -1};
    if (theirs == sig) continue;
    // Every rank sees every post, so every rank fails here.
    throwError(ErrorKind::kMismatch,
               "smddp: " + watch.what() + ": rank " + std::to_string(p) + " called " +
                   theirs.describe() + " at sequence " + std::to_string(seq) +
                   " but this rank called " + sig.describe() + " (collective mismatch)");
  }
}

void SegmentCollectives::finish(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                                const CollectiveSignature& sig) {
  SegmentControl& ctl = segment_.ctl();
  ctl.direct[rank_].done.store(seq + 1, std::memory_order_release);
  segment_.wakeAll();
  await(ctx, watch, seq, sig, [&](int p) {
    return ctl.direct[p].done.load(std::memory_order_acquire) >= seq + 1;
  });
}

void SegmentCollectives::read(int peer, void* local, uint64_t remote, uint64_t bytes,
                              const StallWatch& watch) const {
  std::string err = readProcess(pids_[peer], local, remote, bytes);
  if (err.empty()) return;
  // The peer's process is gone (ESRCH) or its buffer went away under the
  // read: either way that rank cannot finish this call.
  throwError(ErrorKind::kPeerLost, "smddp: " + watch.what() + ": reading rank " +
                                       std::to_string(peer) + "'s buffer failed (" + err +
                                       "); that rank died or left the call");
}

void SegmentCollectives::allGather(EngineContext& ctx, uint64_t seq, Buffer in,
                                   const std::vector<Buffer>& outs, DataType dtype) {
  SMDDP_CHECK(static_cast<int>(outs.size()) == ranks_, kInvalidArgument,
              "allgather needs one output per rank");
  const CollectiveSignature sig{CollectiveType::kAllgather, dtype, ReduceOp::kSum, in.numel, -1};
  const uint64_t bytes = in.numel * elementSize(dtype);
  const auto* src = static_cast<const uint8_t*>(in.data);
  // The peers read `in` while this rank writes its outputs: if one of them
  // (other than `in` itself as its own output) overlaps it, they read a copy.
  bool clash = false;
  for (int p = 0; p < ranks_; ++p) {
    if (p != rank_ || outs[p].data != in.data) clash = clash || overlaps(src, bytes, outs[p].data, bytes);
  }
  if (clash) {
    snapshot_.assign(src, src + bytes);
    src = snapshot_.data();
  }
  if (bytes && outs[rank_].data != src) std::memmove(outs[rank_].data, src, bytes);
  post(seq, sig, {address(src)});
  StallWatch watch(ctx, sig, seq, ctx.waits().timeout());
  awaitPosts(ctx, watch, seq, sig);
  const SegmentControl& ctl = segment_.ctl();
  for (int i = 1; i < ranks_; ++i) {
    const int p = (rank_ + i) % ranks_;
    read(p, outs[p].data, ctl.direct[p].block[0], bytes, watch);
  }
  finish(ctx, watch, seq, sig);
}

void SegmentCollectives::reduceScatter(EngineContext& ctx, uint64_t seq,
                                       const std::vector<Buffer>& ins, Buffer out, DataType dtype,
                                       ReduceOp op) {
  checkOp("reduce_scatter", op, dtype);
  SMDDP_CHECK(static_cast<int>(ins.size()) == ranks_, kInvalidArgument,
              "reduce_scatter needs one input block per rank");
  const CollectiveSignature sig{CollectiveType::kReduceScatter, dtype, op, out.numel, -1};
  const size_t es = elementSize(dtype);
  const uint64_t bytes = out.numel * es;
  // The peers read every block but this rank's own while this rank writes
  // `out`; `out` may be its own block exactly (the kernel allows it).
  bool clash = false;
  for (int p = 0; p < ranks_; ++p) {
    if (p != rank_ || out.data != ins[p].data) clash = clash || overlaps(out.data, bytes, ins[p].data, bytes);
  }
  std::vector<uint64_t> blocks(ranks_);
  for (int p = 0; p < ranks_; ++p) blocks[p] = address(ins[p].data);
  if (clash) {
    snapshot_.resize(bytes * ranks_);
    for (int p = 0; p < ranks_; ++p) {
      if (bytes) std::memcpy(snapshot_.data() + p * bytes, ins[p].data, bytes);
      blocks[p] = address(snapshot_.data() + p * bytes);
    }
  }
  const auto* own = reinterpret_cast<const uint8_t*>(blocks[rank_]);
  post(seq, sig, blocks);
  StallWatch watch(ctx, sig, seq, ctx.waits().timeout());
  awaitPosts(ctx, watch, seq, sig);
  const SegmentControl& ctl = segment_.ctl();
  const uint64_t pieceElems = std::max<uint64_t>(1, kPieceBytes / es);
  pieces_.resize(pieceElems * es * ranks_);
  std::vector<const void*> inputs(ranks_);
  auto* dst = static_cast<uint8_t*>(out.data);
  for (uint64_t off = 0; off < out.numel; off += pieceElems) {
    const uint64_t len = std::min(pieceElems, out.numel - off);
    for (int p = 0; p < ranks_; ++p) {
      if (p == rank_) {
        inputs[p] = own + off * es;
        continue;
      }
      uint8_t* piece = pieces_.data() + p * pieceElems * es;
      read(p, piece, ctl.direct[p].block[rank_] + off * es, len * es, watch);
      inputs[p] = piece;
    }
    reduceOrdered(dst + off * es, inputs.data(), ranks_, len, dtype, op, ranks_);
  }
  finish(ctx, watch, seq, sig);
}

}  // namespace smddp
