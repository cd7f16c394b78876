// What the parts of one group's engine share: the group's identity and
// tunables, what bounds its waits, its endpoint, peers, control plane,
// request pool and counters, the running call's memory, the point-to-point
// operations in flight, and progress(), which hands each completion to its
// owner. The Communicator owns one and runs its queue on it;
// Exchange, StallWatch, the algorithms and the allreduce paths take this
// context instead of the Communicator, so none of them sees the queue.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/call_memory.h"
#include "engine/control_frames.h"
#include "engine/engine_config.h"
#include "engine/p2p_state.h"
#include "engine/peer_table.h"
#include "engine/request.h"
#include "engine/wait_limits.h"
#include "observe/batch_observer.h"
#include "observe/desync.h"
#include "observe/stats.h"
#include "observe/traffic_observer.h"
#include "transport/bootstrap.h"
#include "transport/endpoint.h"
#include "transport/fabric.h"
#include "transport/peer_seal.h"

namespace smddp {

class FormationLaps;

class EngineContext {
 public:
  // The group's set-up up to its endpoint: its key space in the store, who
  // is where (the peer table), the provider, the per-group secret, the
  // endpoint and the peers' addresses, the control plane. Throws on
  // failure (bounded by opts.timeout). `shmTrouble` gets why shared memory
  // was given up, if it was (for the group's one warning); `laps` the
  // set-up's phases (for the group's description).
  EngineContext(Bootstrap& store, const CommOptions& opts, EngineConfig config,
                std::vector<std::string>& shmTrouble, FormationLaps& laps);
  ~EngineContext();
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  // --- Identity and configuration (any thread) ---
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's, for logs, the timeline and errors (callAt, call.h).
  const std::string& name() const { return name_; }
  const EngineConfig& config() const { return config_; }
  const std::string& provider() const { return provider_; }
  const std::string& providerReason() const { return providerReason_; }
  // "smddp/<nonce>/": where this group instance's keys live in the store.
  const std::string& storePrefix() const { return storePrefix_; }
  // Frames without it are dropped.
  uint64_t jobSecret() const { return jobSecret_; }
  // The group timeout and the stop that shutdown requests (wait_limits.h).
  // Any thread.
  WaitLimits& waits() { return waits_; }

  // --- The group's parts ---
  // Host topology and liveness: who and where every rank is, its fabric
  // address, which ranks serve the network path's shards, and whether it
  // is still alive (peer_table.h). Any thread once constructed; its
  // monitor() is thread-safe.
  const PeerTable& peers() const { return peers_; }
  // Error frames, stall probes and the group's broken state
  // (control_frames.h): worker thread only.
  ControlPlane& control() { return control_; }
  // Every posted Request, until its completion (request.h): worker thread only.
  RequestPool& requests() { return requests_; }
  Endpoint& endpoint() { return *endpoint_; }
  // torch_smddp.stats(): atomics, any thread. Only the observers change
  // them.
  StatsCounters& counters() { return stats_; }
  // What the wire code and the algorithms report: bytes, refused frames,
  // abandoned sends, the servers' combine time (traffic_observer.h). Any
  // thread.
  const TrafficObserver& traffic() const { return traffic_; }
  // What a fusion batch's run shows: its timeline spans and stats()'
  // counters of batches and their data steps (batch_observer.h). Any thread.
  const BatchObserver& batches() const { return batches_; }
  // SMDDP_WIRE_ENCRYPT's keys and counters for the peers on other hosts
  // (transport/peer_seal.h); seals nothing when it is off. Worker thread
  // only (the counters).
  PeerSeal& seal() { return seal_; }

  // --- Worker thread only (or a caller running its own call) ---
  // Reads completions and dispatches them; returns how many were read.
  size_t progress();
  // The endpoint may still write into memory that was handed back (a
  // receive whose cancellation was never confirmed): stop polling it for
  // good, fail the point-to-point operations in flight and mark the group
  // unusable with `why`. Nothing progresses the endpoint afterwards, not
  // even a close: release() leaves it open.
  void quarantine(const std::string& why);
  // The message of `e` with the desync report added (desync.h) when `e` is
  // a timeout that breaks the group here first; else e.what(). Asks every
  // rank through the store, within half the timeout (1 to 5 s).
  std::string withDesyncReport(const Error& e);
  // Null without a flight recorder or a clonable store.
  void setDesyncResponder(std::unique_ptr<DesyncResponder> responder) {
    desync_ = std::move(responder);
  }
  // The running call's memory: scratch and fusion buffers, what its
  // abandoned sends hold, the overflow sink (call_memory.h).
  CallMemory& memory() { return memory_; }
  // The point-to-point operations in flight (p2p_state.h; posted by
  // engine/p2p.cc).
  P2PState& p2p() { return p2p_; }

  // --- Shutdown, once no thread runs calls any more ---
  // First: the peers on this host hear that this rank leaves before call
  // `leaveBefore` (ControlPlane::announceLeave; UINT64_MAX: not said), the
  // desync responder's thread ends, and the liveness connections say
  // goodbye, with the same call (peers on other hosts do not take this
  // rank for dead, nor wait for it in a call it never ran).
  void closeLiveness(uint64_t leaveBefore, bool orderly = false);
  // Last: point-to-point operations fail, the endpoint closes (unless
  // quarantined), then the requests, the sink and the owner locks go.
  void release();

 private:
  // Set-up steps (the constructor, in this order).
  void agreeOnSecret(Bootstrap& bootstrap);
  // After the "peer" exchange: this rank's pair keys from its X25519
  // private key, the peers' public keys and the key file's key (if any),
  // once every rank is known to hold the same key file.
  void derivePeerKeys(const std::string& privateKey, std::string preShared);
  // Once the pair keys exist: checks that every rank has this rank's
  // SMDDP_WIRE_ENCRYPT, and keys the seal for the peers on other hosts.
  void keyPeerSeal();
  void openEndpoint(Bootstrap& bootstrap, std::vector<std::string>& shmTrouble);
  void adoptProvider(ProviderChoice choice);

  const int rank_;
  const int size_;
  const std::string name_;
  WaitLimits waits_;
  EngineConfig config_;
  std::string provider_;
  std::string providerReason_;
  bool providerForced_ = false;  // SMDDP_FI_PROVIDER named the provider
  uint64_t jobSecret_ = 0;
  std::shared_ptr<const PeerKeys> peerKeys_;  // set while forming, immutable after
  PeerSeal seal_;                             // keyed while forming; counters: worker thread
  std::string storePrefix_;
  std::shared_ptr<Fabric> fabric_;
  std::unique_ptr<Endpoint> endpoint_;

  RequestPool requests_;  // worker thread only
  // Worker thread only. Both keep a reference to traffic_ (declared below;
  // bound here, used only once constructed). memory_ holds the overflow
  // sink's reservation and unmaps it when it goes, so a constructor that
  // throws after reserving it leaks nothing.
  CallMemory memory_{traffic_};
  P2PState p2p_{requests_, traffic_};
  bool progressing_ = false;   // inside progress(): worker thread only
  bool quarantined_ = false;   // never poll the endpoint again: worker thread only
  // Set up by the constructor; closeLiveness closes its monitor and
  // release() its locks; this rank's owner lock goes with the object.
  PeerTable peers_;
  StatsCounters stats_;
  BatchObserver batches_{name_, stats_};
  TrafficObserver traffic_{stats_};
  // The control plane's view of this engine: progress() and the state
  // that says whether waiting for a peer is still allowed.
  struct ControlEngine final : ControlPlane::Engine {
    explicit ControlEngine(EngineContext& c) : ctx(c) {}
    size_t progress() override { return ctx.progress(); }
    bool inProgress() const override { return ctx.progressing_; }
    bool pollingStopped() const override {
      return ctx.quarantined_ || ctx.waits_.stopRequested();
    }
    std::chrono::milliseconds timeout() const override { return ctx.waits_.timeout(); }
    EngineContext& ctx;
  };
  ControlEngine controlEngine_{*this};
  // Error frames, probes, broken state: worker thread only.
  ControlPlane control_{controlEngine_, peers_, requests_, traffic_};
  std::unique_ptr<DesyncResponder> desync_;  // null without a recorder or a clonable store
  bool desyncReported_ = false;              // worker thread only
};

}  // namespace smddp
