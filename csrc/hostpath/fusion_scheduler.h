// Balanced fusion buffers on one host (docs/design.md, "The allreduce path").
// The group's leader (rank 0) fuses the allreduce calls it has queued into
// one buffer and publishes the cut as a plan in the host segment; the other
// ranks follow the plan, so every rank fuses the same calls whatever the
// timing. The fused buffer is split into S equal, element-aligned shards,
// one per reduction server, and streamed through the segment in steps so
// that copying in, reducing (in rank order) and copying out overlap.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "engine/allreduce_path.h"
#include "engine/engine_config.h"
#include "engine/engine_context.h"
#include "hostpath/host_path.h"
#include "hostpath/host_segment.h"
#include "server/server_link.h"
#include "transport/frame.h"

namespace smddp {

// The fusion scheduler's part of HostPathConfig (fusion_scheduler.cc):
// data-step polling, small batches, streaming stores; readHostPathParams
// reads it with the rest.
void readFusionParams(HostPathConfig& h);

// The group's allreduce path when every host's segment is open
// (openHostPath): the engine hands it each run of queued calls.
class FusionBufferScheduler final : public AllreducePath {
 public:
  using Take = AllreduceBatch::Take;

  // Several hosts: each host's servers reduce its ranks' parts, then the
  // servers with the same index on every host reduce the host partials
  // among themselves over the network (reduction servers again, in host
  // order), and the result comes back through the segment. Rank 0 cuts
  // the batches for every host (see sendPlan).
  FusionBufferScheduler(EngineContext& ctx, std::unique_ptr<HostSegment> segment,
                        HostTopology topo, uint64_t fusionBytes);
  ~FusionBufferScheduler() override;

  // --- AllreducePath ---
  bool fuses() const override { return true; }
  CallPath callPath() const override {
    return topo_.hosts() > 1 ? CallPath::kHierarchy : CallPath::kSharedMemory;
  }
  // Runs batch.first() together with the calls it fuses with (taken from
  // the batch). Throws smddp::Error on failure; the whole batch then fails.
  // batch.onCaller(): the calling thread is the caller of the first call,
  // which reads the result next.
  void run(AllreduceBatch& batch) override;
  // The caller has issued every collective below `next` (caller thread).
  void noteIssued(uint64_t next) override;
  std::string describe() const override;
  int reductionServers() const override { return servers_; }
  // The ranks of this host (arrivals.h), in the group's ranks.
  Stragglers stragglers() const override;
  int standaloneServers() const override { return standalone_; }
  // Unmaps the segment and closes the standalone servers' links.
  void release() override;

  // Across hosts: this rank's connections to the standalone reduction
  // servers (SMDDP_SERVER_HOSTS), set only on a host's server ranks. Each
  // step's host partial is then cut into H + K pieces: the hosts' own
  // servers reduce the first H, the K standalone servers the rest.
  void setServerLinks(std::unique_ptr<ServerLinks> links) { serverLinks_ = std::move(links); }
  void setStandaloneServers(int k) { standalone_ = k; }
  // One host: all-gather and reduce-scatter through the segment.
  void setHostCollectives(std::unique_ptr<HostCollectives> c) { hostCollectives_ = std::move(c); }
  HostCollectives* hostCollectives() const override { return hostCollectives_.get(); }

 private:
  struct Batch;
  void lead(Batch& b, std::vector<AllreduceCall*>& calls, AllreduceBatch& batch);
  void awaitPlanSlot(Batch& b);
  // Across hosts: rank 0 sends each batch's cut to the other hosts'
  // leaders, which take the same calls from their queues (or fail naming
  // both sides when theirs differ).
  void sendPlan(Batch& b, const std::vector<AllreduceCall*>& calls);
  void takeRemotePlan(Batch& b, std::vector<AllreduceCall*>& calls, AllreduceBatch& batch);
  // Sequences below the result are issued on every rank of this host (at
  // least calls[0]: this rank holds it, the others will issue it).
  uint64_t issuedOnHost(uint64_t firstSeq) const;
  // Rank 0: the least of what every host has issued (one message each).
  uint64_t gatherIssued(Batch& b);
  // Checks the calls already taken and takes calls calls.size() .. count - 1
  // of a cut made by `planner` from this rank's queue, each against
  // theirs(i). The first call that differs is recorded and the rest of the
  // cut is still taken, so a failing batch spans the same calls on every
  // rank. Returns the mismatch text, or "".
  std::string takeCut(Batch& b, std::vector<AllreduceCall*>& calls, uint32_t count, int planner,
                      const std::function<CollectiveSignature(uint32_t)>& theirs,
                      AllreduceBatch& batch);
  void follow(Batch& b, std::vector<AllreduceCall*>& calls, AllreduceBatch& batch);
  // The batch's data steps (fusion_steps.cc): copy in, combine and copy
  // out, repeated until this rank's last step is out.
  void stream(Batch& b, const std::vector<AllreduceCall*>& calls);
  struct Steps;
  // Each phase moves as many steps as it can without waiting; true if any.
  bool copyIn(Batch& b, Steps& st);
  bool combine(Batch& b, Steps& st);
  void reduceStep(Batch& b, Steps& st, uint64_t off, uint64_t len);  // step st.r, as a server
  bool copyOut(Batch& b, Steps& st);
  // Nothing moved: waits briefly for a peer's publish or the network.
  void awaitSteps(Batch& b, Steps& st, uint32_t seen);
  // A batch of at most smallBytes_ on one host: one step in which every
  // rank writes its whole part to its own slot and, once every part is
  // there, combines them all in rank order itself. One round of flags
  // instead of three (written, reduced, consumed) and no copy out; the
  // same kernel and order as a server's, so the same bits on every rank.
  void streamSmall(Batch& b, const std::vector<AllreduceCall*>& calls);
  // Whether the leader cuts a batch of `numel` elements as a small one.
  bool smallBatch(uint64_t numel, DataType dt) const {
    return topo_.hosts() == 1 && numel > 0 && numel * elementSize(dt) <= smallBytes_;
  }
  // Blocks briefly when nothing could progress; throws on abort, timeout,
  // a lost peer or a mismatch another rank reported.
  void idle(Batch& b, uint32_t seenWake, const std::function<std::string()>& waitingOn,
            bool mayBlock = true);
  // `kind`: the aborting error's; the other ranks of the host fail the
  // batch as kAborted when it breaks the group, as kMismatch otherwise.
  void abortBatch(Batch& b, const std::string& why, ErrorKind kind);
  // Marks this rank's part of batch b (steps up to endStep) as done.
  void releaseBatch(Batch& b, uint64_t endStep);
  // Marks batch b done for this rank without running it (aborting it for
  // the others), and moves on to the next plan.
  void skipBatch(Batch& b, const std::string& why);
  [[noreturn]] void failMismatch(Batch& b, const std::string& why);
  // The network step of a multi-host batch, pipelined over its steps
  // (cross_host.h).
  class CrossHost;
  int globalRank(int local) const { return topo_.ranksOfHost[topo_.hostIndex][local]; }
  // Across hosts, f16/bf16 host partials stay in f32 (in the result slots
  // and on the wire) and are rounded once, after the last host's part.
  bool widePartials(DataType dt) const {
    return topo_.hosts() > 1 && (dt == DataType::kFloat16 || dt == DataType::kBFloat16);
  }
  // What a batch's f32 partials cross hosts in (SMDDP_CROSS_HOST_DTYPE):
  // the narrow type for SUM and AVG of f32, f16 and bf16; otherwise (and
  // on one host) kFloat32, meaning the partials' own type.
  DataType crossHostWire(DataType dt, ReduceOp op) const;
  // Elements of one shard per pipeline step: what a result slot holds.
  uint64_t chunkElems(DataType dt) const;

  EngineContext& ctx_;
  std::unique_ptr<HostSegment> segment_;  // null once released
  HostTopology topo_;
  int me_;      // this rank in the segment (its local rank)
  int leader_;  // global rank of this host's leader
  uint64_t fusionBytes_;
  int servers_;  // reduction servers per host (the segment's), kept past release()
  int64_t streamSpinUs_ = 0;  // polling budget inside a batch's data steps
  uint64_t smallBytes_ = 0;   // SMDDP_SMALL_BYTES, at most one slot
  std::unique_ptr<ServerLinks> serverLinks_;  // worker thread only
  std::unique_ptr<HostCollectives> hostCollectives_;  // reads segment_: released first
  int standalone_ = 0;                        // K, the same on every rank
  uint64_t nextBatch_ = 0;  // worker thread only
  uint64_t nextStep_ = 0;   // worker thread only
  // Straggler attribution (arrivals.h): the issued mark this rank last
  // published (caller threads, under the queue's lock), and
  // SMDDP_STRAGGLER_REPORT's share in percent (0: no log line).
  uint64_t issuedMark_ = 0;
  int stragglerReport_ = 0;
  void reportStragglers();
  // stats() reads the segment from any thread; release() unmaps it.
  mutable std::mutex segmentMu_;
};

}  // namespace smddp
