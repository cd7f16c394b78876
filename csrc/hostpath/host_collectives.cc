#include "hostpath/host_collectives.h"

#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "algorithms/algorithms_config.h"
#include "algorithms/blocks.h"
#include "hostpath/host_collectives_parts.h"
#include "reduce/stream_copy.h"
#include "algorithms/rounds.h"
#include "common/caller_waiting.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "common/wire_limits.h"
#include "engine/engine_context.h"
#include "engine/exchange.h"
#include "engine/stall_watch.h"
#include "hostpath/fusion_batch.h"
#include "reduce/narrow_wire.h"
#include "reduce/reduce_kernels.h"

namespace smddp {

using namespace hostcoll;

SMDDP_PARAM_BOOL(paramShmCollectives, "SMDDP_SHM_COLLECTIVES", true,
                 "all-gather and reduce-scatter of a group whose ranks share one host read "
                 "each peer's buffer directly (process_vm_readv: one copy, no network); 0, or "
                 "a kernel that forbids those reads, sends them over the network")

namespace {

// An all-gather across hosts reads its host's parts in slices of this
// many bytes, polling its exchange between them.
constexpr uint64_t kPollSliceBytes = 1 << 20;
// One-host all-gathers in which a rank receives this much and up ((ranks
// - 1) x the part) go through the rings (host_rings.cc). Below, the parts
// stay in cache between the peer's write and the read, and one
// process_vm_readv copy beats the rings' two: 2 MiB parts at world 2 took
// 0.47 ms read, 0.83-0.97 through the rings. Reads pin every page they
// touch, once per reader, so the rings pay sooner with more ranks: 2 MiB
// parts at world 4 (6 MiB in) took 2.9 ms through the rings, 3.6 read
// (docs/notes/2026-12-06-floor-back-to-back.md). Two ranks never take
// them: there each rank pins only its one peer's pages, and reading was
// 1.2-2.3x faster than the rings at 16 and 64 MiB, the two measured in
// turns in the same processes; at world 3 the two were even, at world 4
// the rings 1.07-1.2x faster (docs/notes/2026-12-06-sync-calls-on-caller.md).
constexpr uint64_t kRingsFromBytesIn = uint64_t{4} << 20;
constexpr int kRingsFromRanks = 3;
// A private all-gather part on huge pages this large and up is read where
// it lies, not staged (readsInPlace). On huge pages the kernel pins 512
// times fewer pages and its one copy cost 1.7-1.9x a memcpy at 2-4 MiB,
// 1.06-1.61x at 8 MiB and 0.91-1.09x at 32 MiB, against 2-4.8x on 4 KiB
// pages. In turns at world 2 against staging, parts rewritten before every
// call: 1.50-1.98x faster with 4 MiB parts, 1.49-1.72x with 6 MiB,
// 0.99-1.29x with 8 MiB, 1.11-1.32x with 32 MiB; 0.98-1.24x with 3 MiB and
// 0.74-0.91x with 2 MiB; on 4 KiB pages 0.76-0.92x throughout
// (docs/notes/2026-12-07-private-bound.md).
constexpr uint64_t kReadInPlaceFromBytes = uint64_t{4} << 20;
// One process_vm_readv moves at most this much (the kernel's limit is
// about 2 GiB).
constexpr uint64_t kMaxReadBytes = uint64_t{1} << 30;

// Where the poster's pool lies, as its post says.
PoolWhere poolOf(const DirectPost& d) {
  return {d.poolBase, d.poolBytes, static_cast<int>(d.poolFd)};
}

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
                                                             const HostTopology& topo,
                                                             NotOpened* notOpened) {
  const int local = topo.localRank;
  const int n = topo.localSize;
  SMDDP_CHECK(n == segment.ranks(), kInternal, "host collectives need the host's segment");
  const auto timeout = ctx.waits().timeout();
  // Every host holds the same number of ranks here (openHostPath), so every
  // rank reaches the same verdict on the layout.
  if (topo.hosts() > kHostMaxRanks) {
    notOpened->why = "more than " + std::to_string(kHostMaxRanks) + " hosts";
    return nullptr;
  }
  // A word only this process knows, for a peer to read back.
  uint64_t word = 0;
  randomBytes(&word, sizeof(word));
  volatile uint64_t probe = word;
  const std::string mine =
      paramShmCollectives() ? std::to_string(getpid()) + " " +
                                  std::to_string(address(const_cast<uint64_t*>(&probe))) + " " +
                                  std::to_string(static_cast<uint64_t>(probe))
                            : "off";
  PrefixBootstrap host(bootstrap, "host" + std::to_string(topo.hostIndex) + "/");
  auto where = bootstrapAllGather(host, local, n, "hostcoll/where", mine, timeout);
  std::string status = "ok";
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n && status == "ok"; ++r) {
    if (where[r] == "off") status = "off";
    else pids[r] = static_cast<pid_t>(std::strtoll(where[r].c_str(), nullptr, 10));
  }
  if (status == "ok" && n > 1) {
    status = probePeer(ctx.rank(), topo.ranksOfHost[topo.hostIndex][(local + 1) % n],
                       where[(local + 1) % n]);
  }
  // Every rank of every host has read (or failed to) before any probe word
  // goes away, and all take the same path.
  auto votes = bootstrapAllGather(bootstrap, ctx.rank(), ctx.size(), "hostcoll/ok", status, timeout);
  for (const std::string& v : votes) {
    if (v == "ok") continue;
    notOpened->switchedOff = v == "off";
    notOpened->why = notOpened->switchedOff ? "SMDDP_SHM_COLLECTIVES=0" : v;
    return nullptr;
  }
  // Pairwise rounds by the allreduce's rule (algorithms/rounds.h).
  return std::unique_ptr<SegmentCollectives>(
      new SegmentCollectives(segment, topo, pids, ctx.config().crossHostDtype,
                             roundsFromBytes(ctx.config(), topo.hosts()), ctx.traffic()));
}

SegmentCollectives::SegmentCollectives(HostSegment& segment, const HostTopology& topo,
                                       std::vector<pid_t> pids, DataType crossHostDtype,
                                       uint64_t roundsFromBytes, const TrafficObserver& traffic)
    : segment_(segment),
      topo_(topo),
      local_(topo.localRank),
      ranks_(segment.ranks()),
      pids_(std::move(pids)),
      peerPools_(pids_),
      traffic_(traffic),
      crossHostDtype_(crossHostDtype),
      roundsFromBytes_(roundsFromBytes) {}

std::string SegmentCollectives::describe() const {
  if (hosts() == 1 && ranks_ < kRingsFromRanks) {
    return "shared memory: all-gather and reduce-scatter reading the peers' buffers (" +
           std::to_string(ranks_) + " ranks)";
  }
  if (hosts() == 1) {
    return "shared memory: all-gather through each rank's ring in the host segment once a rank "
           "receives " + std::to_string(kRingsFromBytesIn >> 10) +
           " KiB (unless every part lies in a shared pool), smaller ones and reduce-scatter "
           "reading the peers' buffers (" + std::to_string(ranks_) + " ranks)";
  }
  std::string text =
      "hierarchy: shared memory within each host, each rank reading its peers' buffers, and "
      "across hosts only between ranks of the same local index (" +
      std::to_string(hosts()) + " hosts x " + std::to_string(ranks_) + " ranks)";
  if (crossHostDtype_ != DataType::kFloat32) {
    text += "; reduce-scatter's f32 host sums cross in " + std::string(toString(crossHostDtype_));
  }
  if (roundsFromBytes_ != UINT64_MAX) {
    text += "; pairwise rounds for calls of " + std::to_string(roundsFromBytes_ >> 10) +
            " KiB and up";
  }
  return text;
}

CallPath SegmentCollectives::callPath() const {
  return hosts() == 1 ? CallPath::kSharedMemory : CallPath::kHierarchy;
}

void SegmentCollectives::read(int peer, void* local, uint64_t remote, uint64_t bytes,
                              const StallWatch& watch, bool streaming) const {
  if (const uint8_t* at = mapped(peer, remote, bytes)) {
    copyMaybeStreaming(local, at, bytes, streaming);  // the caller fences
    return;
  }
  std::string err = readProcess(pids_[peer], local, remote, bytes);
  if (err.empty()) return;
  // The peer's process is gone (ESRCH) or its buffer went away under the
  // read: either way that rank cannot finish this call.
  throwError(ErrorKind::kPeerLost, "smddp: " + watch.what() + ": reading rank " +
                                       std::to_string(globalRank(topo_.hostIndex, peer)) +
                                       "'s buffer failed (" + err +
                                       "); that rank died or left the call");
}

const uint8_t* SegmentCollectives::mapped(int peer, uint64_t remote, uint64_t bytes) const {
  const uint8_t* at = peerPools_.find(peer, poolOf(postOf(peer)), remote, bytes);
  if (!at) return nullptr;
  traffic_.pooledRead(bytes);
  if (!(mappedPublished_ >> peer & 1)) {
    segment_.ctl().poolMappedBy[peer].fetch_or(uint64_t{1} << local_, std::memory_order_release);
    mappedPublished_ |= uint64_t{1} << peer;
  }
  return at;
}

bool SegmentCollectives::partsPooled(uint64_t bytes) const {
  for (int p = 0; p < ranks_; ++p) {
    const DirectPost& d = postOf(p);
    if (!poolOf(d).contains(d.block[topo_.hostIndex], bytes)) return false;
  }
  return true;
}

bool SegmentCollectives::throughRings(uint64_t bytes) const {
  return hosts() == 1 && ranks_ >= kRingsFromRanks && bytes * (ranks_ - 1) >= kRingsFromBytesIn;
}

void SegmentCollectives::copyOwnPart(EngineContext& ctx, void* dst, const uint8_t* src,
                                     uint64_t bytes) {
  // A part past the streaming size does not fit the caches: streaming
  // stores write the output without reading its lines in first.
  // Two ranks, 16 and 64 MiB, out of place: 1.13-1.20x faster, measured in
  // turns; a 2 MiB part was 7% slower that way (it fits the caches), so
  // the size of the part decides (docs/notes/2026-12-06-sync-calls-on-caller.md).
  if (bytes >= hostPathConfig(ctx.config()).streamingBytes && !overlaps(src, bytes, dst, bytes)) {
    copyStreaming(dst, src, bytes);
    streamingFence();
    return;
  }
  std::memmove(dst, src, bytes);
}

bool SegmentCollectives::readsInPlace(const Buffer& in, uint64_t bytes) const {
  // Measured at two ranks only: at three and more a part not staged goes
  // through the rings instead, and a core per rank would have to decide.
  return in.hugePages && bytes >= kReadInPlaceFromBytes && hosts() == 1 && ranks_ == 2;
}

bool SegmentCollectives::stageStreaming(uint64_t staged, const HostPathConfig& cfg) {
  // Through the caches when the whole copy is below the streaming size and
  // a caller waits (so computes nothing meanwhile). Measured in turns on
  // synchronous calls at worlds 2 and 4: 1.2-1.7x faster with 0.5-2 MiB
  // staged; the same within the runs' spread below 512 KiB and at 3-4 MiB;
  // from 8 MiB streaming stores won, up to 2.6x
  // (docs/notes/2026-12-07-staging-stores.md).
  return staged >= cfg.streamingBytes || !aCallerIsWaiting();
}

const uint8_t* SegmentCollectives::stagePart(const Buffer& in, uint64_t bytes,
                                             const HostPathConfig& cfg, uint64_t eager) {
  // Measured in turns on parts the poster had just written (as FSDP2
  // copies its shards in), against the same calls reading the private
  // parts (process_vm_readv, or the rings): 1.1-4.4x faster at every size
  // from 16 KiB to 64 MiB, worlds 2 and 4 (docs/notes/2026-12-06-staging.md).
  // When another rank's part is not in its pool the call goes through
  // the rings and this copy is not read: pools differ only by how full
  // they are, so that costs a copy of the part in a rare call.
  const auto* src = static_cast<const uint8_t*>(in.data);
  if (ranks_ == 1 || bytes == 0 || bytes > (eager ? eager : cfg.stageBytes) ||
      readsInPlace(in, bytes) || SharedPool::where().contains(address(src), bytes)) {
    return src;
  }
  uint8_t* at = stageRange(bytes, eager);
  if (!at) return src;
  const bool streaming = stageStreaming(bytes, cfg);
  copyMaybeStreaming(at, src, bytes, streaming);
  if (streaming) streamingFence();
  return at;
}

void SegmentCollectives::gatherStep(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                                    const CollectiveSignature& sig, Buffer in,
                                    const std::vector<Buffer>& outs) {
  const size_t es = elementSize(sig.dtype);
  const uint64_t bytes = in.numel * es;
  const int me = ctx.rank();
  const auto* src = static_cast<const uint8_t*>(in.data);
  // The peers read `in` while this rank writes its outputs: if one of them
  // (other than `in` itself as its own output) overlaps it, they read a copy.
  const bool clash = clashes(src, outs, me, bytes);
  const uint64_t eager = eagerBytes(ctx, bytes);
  claimSlot(ctx, watch, seq, sig, eager);
  const StepLeft left(*this, seq);
  // What the peers read: `src`, or its copy in this process's pool, made
  // before any output is written. A clash reads a stable copy everywhere:
  // the staged one when there is one, else a private snapshot. A step
  // whose part was staged for an early leave leaves early.
  const uint8_t* shared = stagePart(in, bytes, hostPathConfig(ctx.config()), eager);
  const bool early = eager != 0 && shared != src;
  if (clash) {
    if (shared == src) {
      snapshot_.assign(src, src + bytes);
      shared = snapshot_.data();
    }
    src = shared;
  }
  // By size; a call whose parts all lie in their ranks' pools is read
  // instead (decided once every post is in, the same on every rank).
  bool rings = throughRings(bytes);
  if (!rings && bytes && outs[me].data != src) copyOwnPart(ctx, outs[me].data, src, bytes);
  // What this rank holds, by host: its own part, and (across hosts) where
  // the part of the rank of its local index on each other host lands.
  const int H = hosts();
  const int host = topo_.hostIndex;
  std::vector<uint64_t> blocks(H);
  for (int h = 0; h < H; ++h) {
    blocks[h] = h == host ? address(shared) : address(outs[globalRank(h, local_)].data);
  }
  post(seq, sig, blocks);
  awaitPosts(ctx, watch, seq, sig);
  // From here every peer is in this step and reads the staged copy until
  // it leaves the step (StepLeft), however it leaves.
  if (early) earlyFlag_[slot_] = flagOf(seq);
  if (rings && partsPooled(bytes)) {
    // One copy per byte from the peers' pools beats a ring's two: 1.2-1.7x
    // at world 3, 1.0-1.5x at world 4 (docs/notes/2026-12-06-shared-pool.md).
    rings = false;
    if (bytes && outs[me].data != src) copyOwnPart(ctx, outs[me].data, src, bytes);
  }
  if (rings) {
    // Only this rank reads `in`: it may leave once it has its peers' parts.
    gatherThroughRings(ctx, watch, seq, sig, src, outs, bytes);
    return;
  }
  if (H == 1) {
    readHostParts(ctx, outs, bytes, watch, [] {});
  } else {
    gatherAcrossHosts(ctx, seq, sig, src, outs, watch);
  }
  markDone(seq);
  if (early) {  // the peers read the staged copy, not `in`
    traffic_.earlyGather();
    return;
  }
  awaitDone(ctx, watch, seq, sig, flagOf(seq));
}

template <typename Poll>
void SegmentCollectives::readHostParts(EngineContext& ctx, const std::vector<Buffer>& outs,
                                       uint64_t bytes, const StallWatch& watch,
                                       const Poll& poll) const {
  const int host = topo_.hostIndex;
  // Parts read from the peers' pools are written past the caches once a
  // rank receives twice the streaming size (8 MiB by default); below,
  // memcpy keeps them in cache. Measured in turns on pooled buffers:
  // 1.4-1.7x faster at 16 and 64 MiB (world 3 and 4; world 2 at 64 MiB),
  // 1.05-1.45x at world 2, 16 MiB (three sittings), and 2.6x slower at
  // world 2, 8 MiB (4 MiB received) (docs/notes/2026-12-06-shared-pool.md). process_vm_readv
  // copies as the kernel does.
  const bool streaming =
      bytes * (ranks_ - 1) >= 2 * hostPathConfig(ctx.config()).streamingBytes;
  for (int i = 1; i < ranks_; ++i) {
    const int p = (local_ + i) % ranks_;
    readPolling(p, static_cast<uint8_t*>(outs[globalRank(host, p)].data),
                postOf(p).block[host], bytes, watch, poll, streaming);
  }
  if (streaming) streamingFence();
}

void SegmentCollectives::gatherAcrossHosts(EngineContext& ctx, uint64_t seq,
                                           const CollectiveSignature& sig, const uint8_t* src,
                                           const std::vector<Buffer>& outs, StallWatch& watch) {
  // This rank's part goes to the ranks of its local index on the other
  // hosts, and theirs arrive, while it reads this host's parts; then the
  // other hosts' parts from this host's peers, each chunk once it landed.
  const int H = hosts();
  const int host = topo_.hostIndex;
  const size_t es = elementSize(sig.dtype);
  const uint64_t bytes = sig.numel * es;
  Exchange ex(ctx, seq, sig, std::chrono::milliseconds(0), Exchange::CallEnd::kLater);
  const std::vector<Chunk> chunks = crossChunks(ctx, sig.numel, es);
  RoundSends sends(ctx, ex, inRounds(bytes * ctx.size()), directChunkBytes(ctx));
  SMDDP_CHECK(chunks.size() < (uint64_t{1} << kLandedSeqShift), kInvalidArgument,
              "all_gather: " + std::to_string(chunks.size()) +
                  " chunks per part across hosts (SMDDP_CHUNK_BYTES too small for " +
                  std::to_string(bytes) + " bytes)");
  landedChunks_.assign(static_cast<size_t>(H) * chunks.size(), 0);
  landedPrefix_.assign(H, 0);
  for (int r = 1; r < H; ++r) {
    const int h = (host - r + H) % H;
    const int peer = globalRank(h, local_);
    auto* dst = static_cast<uint8_t*>(outs[peer].data);
    for (size_t k = 0; k < chunks.size(); ++k) {
      const Chunk& c = chunks[k];
      ex.recv(peer, kPhaseToServer, c.index, dst + c.elemOffset * es, c.elemCount * es,
              [this, h, k, seq, arrive = sends.onArrive()] {
                noteLanded(h, k, seq);
                if (arrive) arrive();
              });
    }
  }
  // Round r: every chunk to host + r, while host - r's come in (in rounds,
  // each send waits for its share of arrivals; else all go at once).
  for (int r = 1; r < H; ++r) {
    for (const Chunk& c : chunks) {
      sends.send(globalRank((host + r) % H, local_), kPhaseToServer, c.index, c.elemOffset * es,
                 src + c.elemOffset * es, c.elemCount * es);
    }
  }
  ex.poll();
  readHostParts(ctx, outs, bytes, watch, [&ex] { ex.poll(); });
  readLandedParts(ctx, ex, watch, seq, sig, outs, chunks, es);
}

void SegmentCollectives::noteLanded(int h, size_t k, uint64_t seq) {
  const size_t n = landedChunks_.size() / landedPrefix_.size();  // chunks per part
  uint8_t* got = landedChunks_.data() + h * n;
  got[k] = 1;
  uint32_t& prefix = landedPrefix_[h];
  if (k != prefix) return;
  while (prefix < n && got[prefix]) ++prefix;
  segment_.ctl().direct[slot_][local_].landed[h].store(((seq + 1) << kLandedSeqShift) | prefix,
                                               std::memory_order_release);
  segment_.wakeAll();
}

void SegmentCollectives::readLandedParts(EngineContext& ctx, Exchange& ex, StallWatch& watch,
                                         uint64_t seq, const CollectiveSignature& sig,
                                         const std::vector<Buffer>& outs,
                                         const std::vector<Chunk>& chunks, size_t es) {
  using clock = std::chrono::steady_clock;
  const int H = hosts();
  const int host = topo_.hostIndex;
  // Chunks of host h's part read from local peer p so far: next[p * H + h].
  std::vector<uint32_t> next(static_cast<size_t>(ranks_) * H, 0);
  const auto total = static_cast<uint32_t>(chunks.size());
  size_t left = static_cast<size_t>(ranks_ - 1) * (H - 1) * total;
  auto landedAt = [&](int p, int h) -> uint32_t {
    const uint64_t v = postOf(p).landed[h].load(std::memory_order_acquire);
    return v >> kLandedSeqShift == seq + 1 ? static_cast<uint32_t>(v & ((1u << kLandedSeqShift) - 1))
                                           : 0;
  };
  auto behind = [&] {  // for messages: the peers whose parts this rank still reads
    std::vector<int> ranks;
    for (int p = 0; p < ranks_; ++p) {
      for (int h = 0; h < H && p != local_; ++h) {
        if (h != host && next[p * H + h] < total) {
          ranks.push_back(globalRank(host, p));
          break;
        }
      }
    }
    return ranks;
  };
  const auto spin = std::chrono::microseconds(ctx.config().spinUs);
  const auto maxSleep = std::chrono::microseconds(ctx.config().sleepUs);
  auto idleSince = clock::now();
  auto sleep = std::chrono::microseconds(1);
  while (left > 0 || !ex.finished()) {
    size_t moved = ex.poll();
    for (int i = 1; i < ranks_; ++i) {
      const int p = (local_ + i) % ranks_;
      for (int k = 1; k < H; ++k) {
        const int h = (host + k) % H;
        uint32_t& from = next[p * H + h];
        const uint32_t to = std::min(landedAt(p, h), total);
        if (to <= from) continue;
        const uint64_t off = chunks[from].elemOffset * es;
        const uint64_t end = (chunks[to - 1].elemOffset + chunks[to - 1].elemCount) * es;
        read(p, static_cast<uint8_t*>(outs[globalRank(h, p)].data) + off,
             postOf(p).block[h] + off, end - off, watch);
        left -= to - from;
        from = to;
        ++moved;
      }
    }
    if (moved > 0) {
      idleSince = clock::now();
      sleep = std::chrono::microseconds(1);
      continue;
    }
    watch.check(seq, &sig, 1, [&] { return rankList(behind()) + "; " + ex.waitingOn(); },
                [&] { return "not seen at this call: " + rankList(behind()); });
    if (clock::now() - idleSince < spin && aCallerIsWaiting()) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(maxSleep, sleep * 2);
  }
}

template <typename Poll>
void SegmentCollectives::readPolling(int peer, uint8_t* local, uint64_t remote, uint64_t bytes,
                                     const StallWatch& watch, const Poll& poll,
                                     bool streaming) const {
  for (uint64_t off = 0; off < bytes; off += kPollSliceBytes) {
    const uint64_t len = std::min(kPollSliceBytes, bytes - off);
    read(peer, local + off, remote + off, len, watch, streaming);
    poll();
  }
}

}  // namespace smddp
