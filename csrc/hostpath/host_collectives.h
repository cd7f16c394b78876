// All-gather and reduce-scatter through the host segment, straight from
// each peer's buffer (docs/design.md, "All-gather and reduce-scatter on
// one host" and "... across hosts"). A rank posts where its blocks lie
// (DirectPost, in the host segment), and every rank copies what it needs
// from the others of its host with cross-memory attach
// (process_vm_readv). On one host, all-gather moves each peer's part once,
// into the output; reduce-scatter reads the other ranks' parts of its own
// block once, a piece at a time into a buffer that stays in cache, and
// combines them in rank order with the reduction servers' kernel, so its
// result has the bits of the network path's.
//
// Across hosts (every host holding L ranks), local rank l of each host
// talks over the network only to local rank l of the other hosts, so no
// byte crosses a link twice: all-gather first swaps its own part with
// them, then gathers through the segment what its host's ranks received;
// reduce-scatter first combines, through the segment, its host's
// contributions to the blocks of the ranks with local index l (in local
// rank order), sends each host sum to its owner, and sums what arrives in
// host order. A rank leaves the call once every rank of its host has read
// what it needs, so that its input may change again; a small all-gather
// of a private part leaves as soon as it has read its peers' (its peers
// read a copy), see eagerBytes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/algorithms.h"  // Chunk
#include "engine/allreduce_path.h"
#include "hostpath/host_path.h"
#include "hostpath/host_segment.h"
#include "hostpath/shared_pool.h"
#include "transport/bootstrap.h"

namespace smddp {

class Exchange;

class EngineContext;
class StallWatch;
class TrafficObserver;

class SegmentCollectives final : public HostCollectives {
 public:
  // Why open() returned null.
  struct NotOpened {
    bool switchedOff = false;  // SMDDP_SHM_COLLECTIVES=0 on some rank, as asked
    std::string why;           // otherwise: what some rank could not do
  };
  // Collective over `bootstrap` (the group's key space; `segment` is this
  // host's, for `topo`'s ranks), bounded by the group timeout: each rank
  // tries to read a peer's memory, and all ranks of all hosts agree. Null
  // when SMDDP_SHM_COLLECTIVES=0 on some rank, some rank could not read (a
  // kernel's ptrace rules, a seccomp filter) or the layout has no such
  // path (hosts of different sizes, more than kHostMaxRanks hosts), with
  // `notOpened` saying which.
  static std::unique_ptr<SegmentCollectives> open(EngineContext& ctx, Bootstrap& bootstrap,
                                                  HostSegment& segment, const HostTopology& topo,
                                                  NotOpened* notOpened);

  // Waits (up to 2 s) for the peers to leave this rank's last early step
  // before its staged copies go back to the pool; keeps them otherwise.
  ~SegmentCollectives() override;

  void allGather(EngineContext& ctx, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
                 DataType dtype) override;
  void reduceScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins, Buffer out,
                     DataType dtype, ReduceOp op) override;
  std::string describe() const override;
  CallPath callPath() const override;

 private:
  // Where local rank p's reduce-scatter block for group rank `owner` lies
  // in p's memory: one address per rank, or one after another from the
  // first (past kHostMaxRanks ranks).
  struct RemoteBlocks {
    const DirectPost* posts;  // the step's slot, by local rank
    bool perBlock;
    uint64_t bytes;
    auto of(int owner) const {
      return [this, owner](int p) {
        return perBlock ? posts[p].block[owner] : posts[p].block[0] + owner * bytes;
      };
    }
  };

  SegmentCollectives(HostSegment& segment, const HostTopology& topo, std::vector<pid_t> pids,
                     DataType crossHostDtype, uint64_t roundsFromBytes,
                     const TrafficObserver& traffic);
  // Whether a call of `bytes` (its larger side: all-gather's output,
  // reduce-scatter's input) crosses hosts in pairwise rounds (RoundSends,
  // algorithms/rounds.h). Receives post in round order either way: from
  // host - 1 first.
  bool inRounds(uint64_t bytes) const { return bytes >= roundsFromBytes_; }

  // Reduce-scatter across hosts, once this host's ranks posted.
  void reduceAcrossHosts(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig,
                         const std::vector<const uint8_t*>& block, const RemoteBlocks& remote,
                         Buffer out, StallWatch& watch);
  // How a reduce-scatter's host sums cross: in `wire`, each chunk where
  // at() says in a host's whole wire form, length() bytes long (the narrow
  // form gives each chunk its own scale).
  struct CrossForm {
    DataType wire;
    DataType dtype;
    bool narrow() const { return wire != dtype; }
    uint64_t at(const Chunk& c) const;
    uint64_t length(const Chunk& c) const;
  };
  // out = the host sums `inputs` (by host, in `form`), added in host order;
  // AVG divides by `world`. Throws kMismatch naming a piece with a bad scale.
  void addHostSums(const std::vector<const uint8_t*>& inputs, const std::vector<Chunk>& chunks,
                   const CrossForm& form, Buffer out, ReduceOp op, int world) const;
  // The form a reduce-scatter's host sums of `dtype` cross hosts in: the
  // narrow wire of SMDDP_CROSS_HOST_DTYPE for f32 sums, else `dtype`.
  DataType crossingWire(DataType dtype, ReduceOp op) const;
  // The group rank of local rank `local` of host `host`.
  int globalRank(int host, int local) const { return topo_.ranksOfHost[host][local]; }
  int hosts() const { return topo_.hosts(); }
  // Publishes this rank's blocks for call `seq`.
  void post(uint64_t seq, const CollectiveSignature& sig, const std::vector<uint64_t>& blocks);
  // Waits until every rank of this host posted call `seq`, and checks that
  // they made the same call (kMismatch naming the first that differs).
  void awaitPosts(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                  const CollectiveSignature& sig);
  // Local rank p's post in the step's slot.
  const DirectPost& postOf(int p) const { return segment_.ctl().direct[slot_][p]; }
  // This rank left the step of call `seq` (directDone): it reads nothing
  // more of it.
  void markDone(uint64_t seq);
  // Marks the step left when it leaves, however it leaves (a rank that
  // failed half way reads nothing more either).
  class StepLeft {
   public:
    StepLeft(SegmentCollectives& c, uint64_t seq) : c_(c), seq_(seq) {}
    ~StepLeft() { c_.markDone(seq_); }
    StepLeft(const StepLeft&) = delete;
    StepLeft& operator=(const StepLeft&) = delete;

   private:
    SegmentCollectives& c_;
    const uint64_t seq_;
  };
  // Waits until every rank of this host left the step whose flag is
  // `flag`, or a later one (`seq` and `sig`: the call waiting, for its
  // messages).
  void awaitDone(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                 const CollectiveSignature& sig, uint64_t flag);
  // A small all-gather on one host leaves once it has read its peers'
  // parts: a private part of at most SMDDP_EAGER_GATHER_BYTES (E) is
  // staged in half `slot_` of stage_'s first 2E, and that copy and its
  // post in slot_ are read by the peers after it left, until they left
  // that step too. One synchronization instead of two
  // (docs/notes/2026-12-07-eager-gather.md). Pooled parts (FSDP2's
  // buffers from allocate_tensor) are read in place and wait: a copy to
  // leave early cost more than the wait it saves (0.33-0.89x at world 2,
  // within the noise at world 4); so did reduce-scatter's early leave
  // (0.72-1.13x at world 4). E for a step of `bytes` per part (if the
  // part is private), or 0: this step waits. Only once every
  // peer has mapped this rank's pool (poolMappedBy), so that the copies
  // stay readable if this process ends right after the call.
  uint64_t eagerBytes(const EngineContext& ctx, uint64_t bytes) const;
  // Whether every rank of this host left the step whose flag is `flag`
  // (or its process ended).
  bool allLeft(uint64_t flag) const;
  // Picks the step's slot ((seq + piece) % 2, alike on every rank) and
  // waits until the peers left the early steps whose posts or staged
  // copies this step would overwrite: the slot's own for a step that may
  // leave early (E = `eager`) and keeps to its half of stage_, both for
  // any other (stage_ may move).
  void claimSlot(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                 const CollectiveSignature& sig, uint64_t eager);
  // Where a step stages `bytes` (stagePart, stageForPeers): stage_ grown
  // to them, or with `eager` (E) the step's half of stage_'s first 2E.
  // Null: no pool, or none free.
  uint8_t* stageRange(uint64_t bytes, uint64_t eager);
  // Waits until arrived(p) holds for every local rank p.
  void await(EngineContext& ctx, StallWatch& watch, uint64_t seq, const CollectiveSignature& sig,
             const std::function<bool(int)>& arrived);
  // What one turn of a driven loop did.
  enum class Turn { kDone, kMoved, kIdle };
  // Calls turn() until it says kDone. After a turn that moved nothing it
  // waits for the segment's wake word (spinning while a caller waits, else
  // sleeping); every 100 us it progresses the network (error frames) and
  // checks the deadline and the peers' health, naming behind()'s ranks.
  void drive(EngineContext& ctx, StallWatch& watch, uint64_t seq, const CollectiveSignature& sig,
             const std::function<Turn()>& turn, const std::function<std::vector<int>()>& behind);
  // All-gather on one host through the rings (host_rings.cc): writes this
  // rank's part `src` (`bytes` long) into its ring a chunk at a time, and
  // copies the peers' chunks out of theirs into `outs`, each as soon as it
  // is there.
  void gatherThroughRings(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                          const CollectiveSignature& sig, const uint8_t* src,
                          const std::vector<Buffer>& outs, uint64_t bytes);
  // All-gather read from the peers: copies this rank's own part `src` to
  // its place `dst` in the output.
  void copyOwnPart(EngineContext& ctx, void* dst, const uint8_t* src, uint64_t bytes);
  // Whether a one-host all-gather of `bytes` per part goes through the
  // rings (the same answer on every rank: it depends on the call only).
  bool throughRings(uint64_t bytes) const;
  // Once every rank of the host posted an all-gather: whether every part
  // lies in its rank's pool (the same answer on every rank, from the
  // posts). Such a call reads the parts instead of taking the rings.
  bool partsPooled(uint64_t bytes) const;
  // Where each local rank's ring stood when the call began (its post);
  // marks everything before that as read by this rank.
  std::vector<uint64_t> ringStarts();
  // Whether this rank's ring may take position `pos`: every peer has read
  // what the slot held.
  bool ringSlotFree(uint64_t pos) const;
  // How many positions local rank p has put in its ring.
  uint64_t ringWritten(int p) const;
  // Puts `len` bytes at ring position `pos` of this rank's ring.
  void ringPut(uint64_t pos, const uint8_t* from, uint64_t len);
  // All-gather: copies this host's peers' own parts into `outs`, calling
  // poll() between slices.
  template <typename Poll>
  void readHostParts(EngineContext& ctx, const std::vector<Buffer>& outs, uint64_t bytes,
                     const StallWatch& watch, const Poll& poll) const;
  // All-gather across hosts, once this host's ranks posted; `src` is this
  // rank's part.
  void gatherAcrossHosts(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig,
                         const uint8_t* src, const std::vector<Buffer>& outs, StallWatch& watch);
  // All-gather across hosts: chunk k of host h's part arrived here (in
  // call `seq`); publishes how many arrived in order from the first.
  void noteLanded(int h, size_t k, uint64_t seq);
  // All-gather across hosts: reads the other hosts' parts from this host's
  // peers, each chunk once it landed there, and progresses `ex` (this
  // rank's own exchange) in between, until both are done.
  void readLandedParts(EngineContext& ctx, Exchange& ex, StallWatch& watch, uint64_t seq,
                       const CollectiveSignature& sig, const std::vector<Buffer>& outs,
                       const std::vector<Chunk>& chunks, size_t es);
  // Where `bytes` at `remote` in local rank `peer`'s memory can be read in
  // place: in this rank's mapping of the peer's pool, or null when the
  // block is not in it (counted in stats' pool_read_bytes when it is).
  const uint8_t* mapped(int peer, uint64_t remote, uint64_t bytes) const;
  // Copies `bytes` at `remote` in local rank `peer`'s memory to `local`:
  // with memcpy from mapped() where it can, else with process_vm_readv.
  // `streaming`: from a pool with streaming stores, which the caller
  // orders (streamingFence) before anyone reads `local`.
  void read(int peer, void* local, uint64_t remote, uint64_t bytes, const StallWatch& watch,
            bool streaming = false) const;
  // Copies `bytes` at `remote` in local rank `peer`'s memory to `local`
  // a slice at a time, calling poll() after each (an exchange in flight).
  template <typename Poll>
  void readPolling(int peer, uint8_t* local, uint64_t remote, uint64_t bytes,
                   const StallWatch& watch, const Poll& poll, bool streaming = false) const;
  // Staging copies what peers would otherwise read from private memory,
  // up to `cfg.stageBytes` (SMDDP_STAGE_BYTES) at a time: the pages stay
  // taken for reuse (PoolScratch). All-gather: this rank's part `in`
  // (`bytes` long), or a copy of it in stage_ when it lies outside this
  // process's pool (and the pool has room), for the peers to read in
  // place; `in` itself where the peer reads it there (readsInPlace).
  // With `eager` (E), up to E into the step's half (stageRange).
  const uint8_t* stagePart(const Buffer& in, uint64_t bytes, const HostPathConfig& cfg,
                           uint64_t eager);
  // Reduce-scatter: copies the blocks this host's peers will read (those
  // of owners with another local index) that lie outside this process's
  // pool into stage_, and points `block` at the copies, so the peers read
  // them in place instead of with process_vm_readv. Leaves `block` as it
  // is when the pool is missing or full, or past `cfg.stageBytes`.
  void stageForPeers(std::vector<const uint8_t*>& block, uint64_t bytes,
                     const HostPathConfig& cfg);
  // Whether the peer reads this rank's all-gather part `in` (`bytes` long)
  // where it lies, with process_vm_readv, instead of a staged copy: a part
  // on huge pages (Buffer::hugePages) of kReadInPlaceFromBytes (4 MiB)
  // and up, two ranks on one host. Each poster's own choice, step by
  // step: its peer reads either form.
  bool readsInPlace(const Buffer& in, uint64_t bytes) const;
  // Whether a staging copy of `staged` bytes in all uses streaming stores
  // (copyStreaming, then streamingFence) or memcpy.
  static bool stageStreaming(uint64_t staged, const HostPathConfig& cfg);
  // A one-host call that would stage more than SMDDP_STAGE_BYTES runs in
  // pieces (host_pieces.cc): each piece a step of the call, posted and
  // read as a whole call is, with the call's own signature (so a mismatch
  // is still found at the first piece). Elements per piece of a call of
  // `numel` elements whose staging copies `copies` bytes per byte of a
  // part, or 0: one step. The same on every rank (the call decides it).
  uint64_t pieceElems(const EngineContext& ctx, uint64_t numel, size_t es, uint64_t copies) const;
  // One step of an all-gather (the whole call, or a piece of it: `in` and
  // `outs` that piece, `sig` the call's). `watch` is the call's: its
  // pieces together wait no longer than the group timeout.
  void gatherStep(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                  const CollectiveSignature& sig, Buffer in, const std::vector<Buffer>& outs);
  // One step of a reduce-scatter, likewise.
  void scatterStep(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                   const CollectiveSignature& sig, const std::vector<Buffer>& ins, Buffer out);
  // The value of a post's flags once reached in step piece_ of call `seq`:
  // steps count up across calls and, within a call, across its pieces.
  static constexpr int kPieceShift = 20;
  uint64_t flagOf(uint64_t seq) const { return ((seq << kPieceShift) | piece_) + 1; }
  // Reduce-scatter: combines, in local rank order, the host's blocks for
  // group rank `owner` into `dst` (`own` is this rank's block; peer p's
  // lies at remote(p)), a piece at a time, calling poll() after each.
  template <typename Remote, typename Poll>
  void combineHost(const uint8_t* own, const Remote& remote, uint8_t* dst, uint64_t numel,
                   DataType dtype, ReduceOp op, double avgDivisor, const StallWatch& watch,
                   const Poll& poll);

  HostSegment& segment_;
  const HostTopology topo_;
  const int local_;   // this rank's index on its host
  const int ranks_;   // ranks on this host
  const std::vector<pid_t> pids_;  // by local rank
  // The peers' pools, mapped as their blocks are first found in them, and
  // (bit p) those whose mapping this rank has published (poolMappedBy).
  mutable PeerPools peerPools_;
  mutable uint64_t mappedPublished_ = 0;
  const TrafficObserver& traffic_;  // the group's (stats' pool_read_bytes)
  // A private copy of this rank's input when the output overlaps it in a
  // way the peers' reads would see; the pieces of the peers' parts; across
  // hosts, this host's sums and what the other hosts sent.
  std::vector<uint8_t> snapshot_;
  // A call in pieces whose input overlaps an output reads this copy of it.
  std::vector<uint8_t> wholeCopy_;  // freed when the call leaves
  uint64_t piece_ = 0;  // the step of the call running now (flagOf)
  int slot_ = 0;        // its post slot (claimSlot)
  // By slot: the flag of the last step that left before its peers read
  // it, until a later step saw them leave it; 0: none.
  uint64_t earlyFlag_[2] = {0, 0};
  PoolScratch stage_;  // stagePart's and stageForPeers' copies
  std::vector<int> stagedOwners_;  // stageForPeers' owners, kept to reuse its storage
  std::vector<uint8_t> pieces_;
  std::vector<uint8_t> hostSums_;
  std::vector<uint8_t> packed_;  // the host sums in the narrow wire form
  std::vector<uint8_t> arrived_;
  // All-gather across hosts: by host, which chunks arrived, and how many
  // in order from the first.
  std::vector<uint8_t> landedChunks_;  // by host, then chunk
  std::vector<uint32_t> landedPrefix_;
  const DataType crossHostDtype_;  // SMDDP_CROSS_HOST_DTYPE
  // Calls this big and up cross in pairwise rounds (SMDDP_ROUNDS_MIN_HOSTS
  // and SMDDP_ROUNDS_MIN_BYTES, as the allreduce's); UINT64_MAX: never.
  const uint64_t roundsFromBytes_;
};

}  // namespace smddp
