// The engine context (engine_context.h): the group's set-up up to its
// endpoint, progress(), which hands each completion to its owner, and the
// release of it all at shutdown. The running call's memory is in
// call_memory.cc, the point-to-point operations in flight in p2p_state.cc.
#include "engine/engine_context.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/crypto.h"
#include "common/logging.h"
#include "engine/exchange.h"
#include "engine/formation_laps.h"
#include "common/key_file.h"
#include "transport/spare_endpoints.h"

namespace smddp {

namespace {

// From the OS's CSPRNG (common/crypto.h): it keeps other groups' data
// frames apart. Anyone who reads the store knows it, so it proves nothing:
// control frames and liveness messages carry the MAC of a pair key
// (derivePeerKeys).
uint64_t randomSecret() {
  uint64_t s = 0;
  randomBytes(&s, sizeof(s));
  return s ? s : 1;
}

// The job's key file (SMDDP_SERVER_KEY_FILE), mixed into the pair keys:
// "" without one.
std::string peerKeyFile() {
  const std::string path = serverKeyFileParam();
  return path.empty() ? "" : readServerKeyFile(path, "SMDDP_SERVER_KEY_FILE");
}

// What a rank publishes about its key file: a one-way function of the key
// and the group, so ranks with different files fail formation by name
// rather than refusing each other's frames.
std::string keyFileCheck(const std::string& key, const std::string& group) {
  if (key.empty()) return "";
  const Mac m = hmacSha256(key, {"smddp peer key file check v1", group});
  char buf[17];
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | m.bytes[i];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

void applyRegisteredServers(EngineConfig& c, const std::optional<RegisteredServers>& servers) {
  if (servers) {
    c.serverHosts = servers->hosts;
    c.serverKey = servers->key;
  }
  const int64_t count = c.serverCount;
  SMDDP_CHECK(count == 0 || c.serverHosts.empty() ||
                  count == static_cast<int64_t>(c.serverHosts.size()),
              kInvalidArgument,
              "SMDDP_SERVER_COUNT=" + std::to_string(count) + " but SMDDP_SERVER_HOSTS lists " +
                  std::to_string(c.serverHosts.size()) + " server(s)");
  SMDDP_CHECK(count == 0 || !c.serverHosts.empty(), kInvalidArgument,
              "SMDDP_SERVER_COUNT is set but no server addresses: torch_smddp looks them up in "
              "the job's store when the group is made through torch.distributed "
              "(python -m torch_smddp.server --rendezvous HOST:PORT --job SMDDP_SERVER_JOB)");
}

DataType parseCrossHostDtype(const std::string& value, const std::string& source) {
  std::string v;
  for (char c : value) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "fp32" || v == "float32") return DataType::kFloat32;
  if (v == "bf16" || v == "bfloat16") return DataType::kBFloat16;
  if (v == "fp16" || v == "float16" || v == "half") return DataType::kFloat16;
  throwError(ErrorKind::kInvalidArgument,
             source + "='" + value + "' is not a cross-host dtype: use fp32, bf16 or fp16");
}

EngineContext::EngineContext(Bootstrap& store, const CommOptions& opts, EngineConfig config,
                             std::vector<std::string>& shmTrouble, FormationLaps& laps)
    : rank_(opts.rank), size_(opts.size), name_(opts.name), waits_(opts.timeout),
      config_(std::move(config)) {
  applyRegisteredServers(config_, opts.servers);  // the key lives on in config_ only
  if (!opts.crossHostDtype.empty()) {
    config_.crossHostDtype = parseCrossHostDtype(opts.crossHostDtype, "cross_host_dtype");
  }
  SMDDP_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, kInvalidArgument,
              "invalid rank " + std::to_string(rank_) + " for world size " +
                  std::to_string(size_));
  // 0. This group instance's own key space: a store reused by a later
  //    group (or a restarted job) still holds the keys of earlier ones.
  storePrefix_ = "smddp/" + joinGroupInstance(store, rank_, size_, opts.timeout, name_) + "/";
  PrefixBootstrap bootstrap(store, storePrefix_);
  laps.lap("join");
  // 1. Who is where: host identity, pid, PID namespace and shm owner of
  //    every rank, and each one's public key for the group's pair keys.
  {
    const X25519KeyPair pair = x25519KeyPair();
    const std::string preShared = peerKeyFile();
    peers_.gather(bootstrap, rank_, size_, opts.timeout, pair.publicKey,
                  keyFileCheck(preShared, storePrefix_), config_.wireEncrypt);
    derivePeerKeys(pair.privateKey, preShared);
  }
  keyPeerSeal();
  laps.lap("peers");
  peers_.placeNetworkServers(config_.serversPerNode);
  // 2. The same provider on every rank (everyone saw the same host list
  //    and has the same SMDDP_FI_PROVIDER and FI_PROVIDER): a conflict
  //    between those two fails every rank here, with the same message.
  ProviderRequest request = providerRequest(peers_.oneHost());
  // Ranks that are threads of one process (torchft's tests, say): the shm
  // provider hands an endpoint of the process its peer's own region rather
  // than a mapping of it, so a peer that closes first leaves the others a
  // dangling pointer (a crash in their next send).
  if (peers_.sharesProcess()) request.noShm = "ranks of this group share a process";
  adoptProvider(chooseProvider(request));
  // 3. A per-group secret: frames without it are dropped.
  agreeOnSecret(bootstrap);
  memory_.reserveSink();
  laps.lap("secret");
  // 4. Endpoint and addresses, then the control plane's receives.
  openEndpoint(bootstrap, shmTrouble);
  laps.lap("endpoint");
  auto names = bootstrapAllGather(bootstrap, rank_, size_, "addr", endpoint_->name(), opts.timeout);
  laps.lap("addresses");
  peers_.watch(bootstrap, *endpoint_, endpoint_->insertPeers(names), peerKeys_, opts.timeout);
  laps.lap("liveness");
  control_.start(*endpoint_, jobSecret_, peerKeys_, memory_.overflowSink());
  control_.greetHost(std::min<std::chrono::milliseconds>(opts.timeout, std::chrono::seconds(10)));
  laps.lap("host links");
  if (opts.keepSpare) prepareSpareEndpoint(provider_, kSparePause);
}

void EngineContext::adoptProvider(ProviderChoice choice) {
  provider_ = std::move(choice.provider);
  providerReason_ = std::move(choice.why);
  providerForced_ = choice.forced;
}

EngineContext::~EngineContext() = default;

void EngineContext::derivePeerKeys(const std::string& privateKey, std::string preShared) {
  const std::string& mine = peers_.info(rank_).keyCheck;
  for (int r = 0; r < size_; ++r) {
    const std::string& theirs = peers_.info(r).keyCheck;
    SMDDP_CHECK(theirs == mine, kInvalidArgument,
                "smddp: rank " + std::to_string(r) + " and rank " + std::to_string(rank_) +
                    " disagree on the job's key file (SMDDP_SERVER_KEY_FILE): " +
                    (theirs.empty() || mine.empty() ? "one of them has none"
                                                    : "their keys differ") +
                    "; every rank needs the same one, or none");
  }
  std::vector<std::string> publicKeys;
  for (int r = 0; r < size_; ++r) publicKeys.push_back(peers_.info(r).publicKey);
  peerKeys_ = std::make_shared<const PeerKeys>(
      PeerKeys::derive(rank_, privateKey, publicKeys, storePrefix_, preShared));
  wipe(preShared);
}

void EngineContext::keyPeerSeal() {
  // Every rank decides alone whether a frame to a peer is sealed, so they
  // must agree: a rank that sealed for one that does not would have its
  // frames refused as malformed, far from the cause.
  const bool mine = config_.wireEncrypt;
  for (int r = 0; r < size_; ++r) {
    const bool theirs = peers_.info(r).wireEncrypt;
    SMDDP_CHECK(theirs == mine, kInvalidArgument,
                "smddp: SMDDP_WIRE_ENCRYPT differs across the ranks of group '" + name_ +
                    "': rank " + std::to_string(rank_) + " has " + (mine ? "1" : "0") +
                    ", rank " + std::to_string(r) + " has " + (theirs ? "1" : "0") +
                    "; set the same value on every rank");
  }
  if (!mine) return;
  // Only frames that leave the host: shm and the host segment stay inside.
  std::vector<bool> sealed(static_cast<size_t>(size_), false);
  for (int r = 0; r < size_; ++r) {
    sealed[static_cast<size_t>(r)] = r != rank_ && !peers_.sameHost(r);
  }
  seal_ = PeerSeal::derive(*peerKeys_, sealed);
}

void EngineContext::agreeOnSecret(Bootstrap& bootstrap) {
  if (rank_ == 0) {
    jobSecret_ = randomSecret();
    bootstrap.set("secret", std::to_string(jobSecret_));
  } else {
    jobSecret_ = std::stoull(bootstrap.get("secret", waits_.timeout()));
  }
}

void EngineContext::openEndpoint(Bootstrap& bootstrap, std::vector<std::string>& shmTrouble) {
  // libfabric's shm provider refuses a /dev/shm it finds too small, and
  // its region may not fit: then every rank of the one-host job takes tcp
  // instead (never one rank alone).
  const bool forced = providerForced_;
  std::string shmStatus = "ok";
  auto adopt = [this](OpenedEndpoint opened) {
    fabric_ = std::move(opened.fabric);
    endpoint_ = std::move(opened.endpoint);
  };
  try {
    adopt(spareOrFreshEndpoint(provider_));  // never a spare on shm
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTransport || provider_ != "shm" || forced) throw;
    shmStatus = e.what();
  }
  if (provider_ == "shm" && !forced) {
    auto verdicts =
        bootstrapAllGather(bootstrap, rank_, size_, "shmprovider", shmStatus, waits_.timeout());
    auto bad = std::find_if(verdicts.begin(), verdicts.end(),
                            [](const std::string& v) { return v != "ok"; });
    if (bad != verdicts.end()) {
      // libfabric refuses shm when /dev/shm has less free space than its
      // region size times the cores, and our reservation may not fit.
      shmTrouble.push_back("libfabric's shm provider is unusable on rank " +
                           std::to_string(bad - verdicts.begin()) + " (" + *bad +
                           "; it wants its region size per core free in /dev/shm)");
      ProviderRequest request = providerRequest(true);
      request.noShm = "one host, but the shm provider is unusable on some rank";
      adoptProvider(chooseProvider(request));
      endpoint_.reset();
      fabric_.reset();
    }
  }
  if (!endpoint_) adopt(spareOrFreshEndpoint(provider_));
}

size_t EngineContext::progress() {
  if (quarantined_) return 0;
  Completion batch[16];
  size_t n = endpoint_->poll(batch, 16);
  progressing_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{progressing_};
  if (control_.hasPending()) control_.retryPending();
  for (size_t i = 0; i < n; ++i) {
    Request* r = static_cast<Request*>(batch[i].context);
    if (!r || !requests_.owns(r)) continue;
    if (r->owner) {
      r->owner->complete(r, batch[i]);
    } else if (r->onComplete) {
      p2p_.complete(r, batch[i]);
    } else if (r->type == Request::Type::kErrorRecv) {
      control_.handleFrame(r, batch[i]);
    } else {
      if (r->type == Request::Type::kLeaveSend) control_.leaveSent();
      requests_.release(r);  // orphaned, cancelled, or a fire-and-forget error send
    }
  }
  return n;
}

void EngineContext::quarantine(const std::string& why) {
  if (quarantined_) return;
  quarantined_ = true;
  control_.markBroken(why);
  SMDDP_LOG(kWarn) << "group '" << name_ << "' rank " << rank_
                   << " stops using its endpoint: " << why;
  p2p_.fail(why, false);
}

std::string EngineContext::withDesyncReport(const Error& e) {
  // Only a timeout asks: a lost peer is named in its error already, and its
  // survivors must fail within moments of noticing (a rank cut off from the
  // store, on a host whose link went down, would wait out the budget).
  if (!desync_ || desyncReported_ || e.kind() != ErrorKind::kTimeout || control_.broken()) {
    return e.what();
  }
  desyncReported_ = true;
  // Long enough for a store round trip to every rank on a loaded host
  // (the answering threads may wait for a core), short next to the
  // timeout that brought us here.
  const auto budget = std::clamp(waits_.timeout() / 2, std::chrono::milliseconds(1000),
                                 std::chrono::milliseconds(5000));
  const std::string report =
      desync_->collect(budget, [this](int r) { return peers_.lost(r); }, e.what());
  return std::string(e.what()) + ". Desync report: " + report;
}

void EngineContext::closeLiveness(uint64_t leaveBefore, bool orderly) {
  if (leaveBefore != UINT64_MAX) {
    // A peer that already closed its endpoint may never take the notice:
    // bounded, and short next to any group timeout.
    if (!quarantined_) control_.announceLeave(leaveBefore, std::chrono::milliseconds(100));
    peers_.noteFirstUnfinished(leaveBefore);
  }
  if (desync_ && orderly && rank_ == 0) {
    // Every call finished and nothing failed: the peers are leaving too.
    // Rank 0 usually hosts the store and takes it away when its process
    // exits; it waits a moment for the peers' answering threads to leave
    // the store first.
    desync_->awaitPeersStopped(std::chrono::milliseconds(1000),
                               [this](int r) { return peers_.lost(r); });
  }
  desync_.reset();        // its answering thread ends (or is left behind on a hung store)
  peers_.closeMonitor();  // says goodbye: peers on other hosts do not take this for a death
}

void EngineContext::release() {
  // Point-to-point operations still posted get an "aborted" completion.
  p2p_.fail("the process group was shut down", false);
  // Closing the endpoint discards whatever is still posted; only then may
  // the requests' memory go. A quarantined endpoint is never closed: it
  // holds receives that were never confirmed cancelled (and sends to a
  // peer that is gone), and fi_close progresses it one last time. rxm
  // (libfabric 1.17, over tcp) then flushes its connections' completion
  // queue and runs its handlers over those abandoned transfers: a late
  // receive may land in memory handed back long ago, and an error
  // completion without a context crashes it (SIGSEGV in
  // rxm_handle_comp_error under rxm_ep_close, seen in test_cluster's
  // link-down case when many cross-host steps were in flight). Nothing
  // progresses a leaked endpoint (manual progress), so the requests, the
  // sink and the buffers its operations point into can go; its sockets
  // and provider memory stay until the process exits, like a held send's
  // buffer.
  if (quarantined_) {
    SMDDP_LOG(kDebug) << "group '" << name_ << "' rank " << rank_
                      << ": its quarantined endpoint is left open, never closed";
    (void)endpoint_.release();  // deliberately leaked, with the fabric it holds
  } else {
    endpoint_.reset();
  }
  fabric_.reset();
  control_.close();  // their requests go with requests_
  requests_.clear();
  memory_.releaseSink();
  peers_.releaseLocks();
}

}  // namespace smddp
