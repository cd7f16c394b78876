#include "server/standalone_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <system_error>
#include <utility>

#include "common/error.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "server/server_auth.h"
#include "server/server_handshake.h"
#include "server/server_limits.h"
#include "server/stream_service.h"
#include "transport/peer_monitor.h"
#include "transport/socket_address.h"

namespace smddp {

namespace {

using Clock = std::chrono::steady_clock;

ServerFrame errorFrame() {
  ServerFrame f;
  f.kind = static_cast<uint8_t>(ServerFrameKind::kError);
  return f;
}

// An error frame that goes out now or never: the accept loop never waits
// on a peer (a fresh connection's send buffer always takes it). Sealed
// when the connection's frames are (a waiting host's).
void tellNow(int fd, const std::string& text, FrameSeal* seal = nullptr) {
  ServerFrame f = errorFrame();
  f.payload = std::min<uint64_t>(text.size(), kServerMaxText);
  std::string out(reinterpret_cast<const char*>(&f), sizeof(f));
  out.append(text, 0, f.payload);
  if (seal) {
    auto* body = reinterpret_cast<uint8_t*>(out.data()) + sizeof(f);
    const Tag m = seal->seal(f, body, body);
    out.append(reinterpret_cast<const char*>(m.bytes), kTagBytes);
  }
  (void)::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

std::string key(const StandaloneServer::Options& o) {
  if (!o.key.empty()) {
    SMDDP_CHECK(o.key.size() >= 16, kInvalidArgument,
                "reduction server: a key needs at least 16 bytes");
    return o.key;
  }
  if (!o.keyFile.empty()) return readServerKeyFile(o.keyFile, "--key-file");
  const std::string path = serverKeyFileParam();
  if (!path.empty()) return readServerKeyFile(path, "SMDDP_SERVER_KEY_FILE");
  throwError(ErrorKind::kInvalidArgument,
             "reduction server: no key: give it --key-file FILE (or SMDDP_SERVER_KEY_FILE), or "
             "--rendezvous and --job for a key generated per job in that store");
}

}  // namespace

// A stream some of whose hosts joined: by host, the connections and what
// their hellos said; it expires if the rest do not come in time. What its
// hosts reserved of the memory budget goes back when the last owner (the
// accept loop, or the stream's thread) lets go of it.
struct StandaloneServer::Waiting {
  explicit Waiting(std::atomic<int64_t>& budget) : reserved(budget) {}
  ~Waiting() { reserved.fetch_sub(bytes); }
  uint64_t group = 0;
  int stream = 0;
  int hosts = 0;
  std::vector<StreamHost> members;  // by host; no connection until it joined
  int joined = 0;
  Clock::time_point expires{};
  std::atomic<int64_t>& reserved;  // the server's limits_->reserved()
  int64_t bytes = 0;               // this stream's share of it
  std::vector<JobSlot> slots;      // its hosts' connections, counted per job
};

// What one accept loop owns alone: its listener's unproven connections
// and its streams still waiting for hosts. No lock: nothing here is shared.
struct StandaloneServer::Front {
  int server = 0;
  std::string who;
  std::vector<std::unique_ptr<ServerHandshake>> pending;  // oldest first
  std::map<std::pair<uint64_t, int>, std::shared_ptr<Waiting>> waiting;
  // Out of descriptors (EMFILE, ENFILE) or kernel memory: the listener is
  // left alone until then, and the trouble is logged once, not per try.
  Clock::time_point backoffUntil{};
  std::chrono::milliseconds backoff{0};
  bool starved = false;
};

StandaloneServer::StandaloneServer(Options options) : options_(std::move(options)) {
  SMDDP_CHECK(options_.count >= 1 && options_.count <= 1024, kInvalidArgument,
              "reduction server: --servers must be in 1..1024");
  const std::string shared = key(options_);
  requireIntegrity_ =
      options_.requireIntegrity < 0 ? serverIntegrityParam() : options_.requireIntegrity > 0;
  encrypt_ = options_.encrypt < 0 ? wireEncryptParam() : options_.encrypt > 0;
  if (options_.handshakeTimeout.count() <= 0) options_.handshakeTimeout = std::chrono::seconds(10);
  if (options_.maxWait.count() <= 0) options_.maxWait = serverMaxWaitParam();
  limits_ = std::make_unique<ServerLimits>(options_.maxConnections, options_.unprovenPerSource,
                                           options_.jobConnections, options_.memoryBudget);
  for (int i = 0; i < options_.count; ++i) {
    int port = 0;
    const int want = options_.basePort ? options_.basePort + i : 0;
    SMDDP_CHECK(want <= 65535, kInvalidArgument,
                "reduction server: port " + std::to_string(want) + " is past 65535");
    listeners_.push_back(listenOn(options_.bindAddress, want, &port, "reduction server", 256));
    ports_.push_back(port);
    auto id = std::make_unique<ServerIdentity>();
    id->key = shared;
    id->job = options_.job;
    for (const auto& ip : options_.advertise) id->advertised.push_back(endpointText(ip, port));
    identities_.push_back(std::move(id));
  }
  std::lock_guard<std::mutex> g(mu_);
  for (int i = 0; i < options_.count; ++i) threads_.emplace_back([this, i] { acceptLoop(i); });
}

StandaloneServer::~StandaloneServer() { stop(); }

void StandaloneServer::stop() {
  if (stop_.exchange(true)) return;
  std::vector<std::thread> threads;
  // Stream threads may still be started by an accept loop until it sees
  // stop_: join until none is left.
  while (true) {
    {
      std::lock_guard<std::mutex> g(mu_);
      threads.swap(threads_);
    }
    if (threads.empty()) break;
    for (auto& t : threads) t.join();
    threads.clear();
  }
  listeners_.clear();
}

int64_t StandaloneServer::reserved() const { return limits_->reservedNow(); }
int64_t StandaloneServer::memoryBudget() const { return limits_->memoryBudget(); }

size_t StandaloneServer::threads() const {
  std::lock_guard<std::mutex> g(mu_);
  return threads_.size();
}

void StandaloneServer::reapThreads() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto id : finished_) {
      auto it = std::find_if(threads_.begin(), threads_.end(),
                             [id](const std::thread& t) { return t.get_id() == id; });
      if (it == threads_.end()) continue;  // stop() took it
      done.push_back(std::move(*it));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (auto& t : done) t.join();  // each has returned or is returning
}

std::string StandaloneServer::lastError() const {
  std::lock_guard<std::mutex> g(mu_);
  return lastError_;
}

void StandaloneServer::noteError(const std::string& text) {
  // At most 20 lines per 10 s: a flood of bad connections must not become
  // a flood of log lines. The first line after a crowded window says how
  // many it left out.
  constexpr uint64_t kLinesPerWindow = 20;
  constexpr auto kWindow = std::chrono::seconds(10);
  refused_++;
  uint64_t left = 0;
  bool log = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    lastError_ = text;
    const auto now = Clock::now();
    if (now - logWindow_ >= kWindow) {
      left = unlogged_;
      logWindow_ = now;
      logged_ = unlogged_ = 0;
    }
    log = logged_ < kLinesPerWindow;
    if (log) ++logged_;
    else ++unlogged_;
  }
  if (left) {
    SMDDP_LOG(kWarn) << "reduction server: " << left << " more refusals or failures were not "
                     << "logged (at most " << kLinesPerWindow << " lines per 10 s)";
  }
  if (log) {
    SMDDP_LOG(kWarn) << text;
  }
}

void StandaloneServer::acceptLoop(int server) {
  // Named, so that an operator (and the hostile suite) can tell the accept
  // loops from the stream loops in top -H or /proc/PID/task.
  nameThisThread("smddp-accept");
  Front front;
  front.server = server;
  front.who = "reduction server " + std::to_string(server);
  while (!stop_.load()) {
    reapThreads();
    try {
      turn(front);
    } catch (const std::exception& e) {
      // bad_alloc or the like: this turn's connection goes, the loop stays.
      noteError(front.who + ": " + e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void StandaloneServer::turn(Front& front) {
  // Slots: the listener (unless backing off), each unproven connection,
  // then each host of each waiting stream (watched only for a hang-up: its
  // data stays in the socket until the stream serves).
  // A turn that threw out (past the catch below: noteError out of memory)
  // may have left finished handshakes behind as null entries.
  std::erase(front.pending, nullptr);
  std::vector<pollfd> fds;
  std::vector<std::pair<Waiting*, int>> hosts;
  const auto now = Clock::now();
  const bool listening = now >= front.backoffUntil;
  fds.push_back({listening ? listeners_[front.server].get() : -1, POLLIN, 0});
  for (auto& hs : front.pending) fds.push_back({hs->fd(), hs->events(), 0});
  for (auto& [k, w] : front.waiting) {
    for (size_t h = 0; h < w->members.size(); ++h) {
      if (!w->members[h].conn) continue;
      fds.push_back({w->members[h].conn.fd(), POLLRDHUP, 0});
      hosts.emplace_back(w.get(), static_cast<int>(h));
    }
  }
  if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return;
  }
  // A host of a waiting stream that hung up: its group gave up on this
  // server (or died), so the stream can never serve. Marked before any
  // handshake completes a stream (and hands it to a thread of its own).
  const size_t P = front.pending.size();
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (fds[1 + P + i].revents) hosts[i].first->expires = Clock::time_point::min();
  }
  // Then the handshakes (the listener's new ones join the list behind them).
  // A throw while one connection is handled (bad_alloc in admit(), say)
  // drops that connection alone: the others, and the loop, go on.
  for (size_t i = 0; i < P; ++i) {
    auto& hs = front.pending[i];
    if (!fds[1 + i].revents && Clock::now() < hs->deadline()) continue;
    try {
      const auto state = hs->step();
      if (state == ServerHandshake::State::kGoing) continue;
      if (state == ServerHandshake::State::kDone) {
        admit(front, *hs);
      } else {
        if (!hs->refusal().empty()) tellNow(hs->fd(), front.who + ": " + hs->refusal());
        noteError(front.who + ": refused a connection: " + hs->why());
      }
    } catch (const std::exception& e) {
      hs.reset();  // first: noteError may throw too (no memory)
      noteError(front.who + ": dropped a connection: " + e.what());
    }
    hs.reset();
  }
  front.pending.erase(std::remove(front.pending.begin(), front.pending.end(), nullptr),
                      front.pending.end());
  expire(front);
  if (listening && (fds[0].revents & POLLIN)) acceptSome(front);
}

void StandaloneServer::expire(Front& front) {
  const auto now = Clock::now();
  for (auto it = front.waiting.begin(); it != front.waiting.end();) {
    if (now < it->second->expires) {
      ++it;
      continue;
    }
    if (it->second->expires != Clock::time_point::min()) {
      const std::string why = "standalone reduction server " + std::to_string(front.server) +
                              ": stream " + std::to_string(it->second->stream) +
                              " expired with " + std::to_string(it->second->joined) + " of its " +
                              std::to_string(it->second->hosts) + " hosts";
      for (auto& m : it->second->members) {
        if (m.conn) tellNow(m.conn.fd(), why, m.seal.get());
      }
      noteError(why);
    }
    streams_--;
    it = front.waiting.erase(it);  // closes its connections
  }
}

void StandaloneServer::acceptSome(Front& front) {
  const int listener = listeners_[front.server].get();
  for (int i = 0; i < 64 && !stop_.load(); ++i) {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      if (e == EINTR || e == ECONNABORTED) continue;
      if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        // Retried at once this would spin: the connection stays in the
        // backlog and poll says so again. Back off, up to a second.
        front.backoff = std::clamp(front.backoff * 2, std::chrono::milliseconds(50),
                                   std::chrono::milliseconds(1000));
        front.backoffUntil = Clock::now() + front.backoff;
        if (!front.starved) {
          front.starved = true;
          SMDDP_LOG(kWarn) << front.who << ": cannot accept connections (" << strerror(e)
                           << "); retrying every " << front.backoff.count()
                           << " ms or more until resources free up (ulimit -n, "
                              "SMDDP_SERVER_MAX_CONNECTIONS)";
        }
      }
      return;
    }
    if (front.starved) {
      front.starved = false;
      SMDDP_LOG(kWarn) << front.who << ": accepting connections again";
    }
    front.backoff = std::chrono::milliseconds(0);
    ServerConnection conn(fd, &connections_);
    std::string source = socketEndpoint(fd, /*local=*/false);
    source.erase(std::min(source.rfind(':'), source.size()));
    if (!makeRoom(front, source)) {
      tellNow(fd, front.who + " is busy: it holds SMDDP_SERVER_MAX_CONNECTIONS=" +
                      std::to_string(limits_->maxConnections()) + " connections");
      noteError(front.who + ": refused a connection: at SMDDP_SERVER_MAX_CONNECTIONS=" +
                std::to_string(limits_->maxConnections()));
      continue;
    }
    setNoDelay(fd);
    boundSilence(fd, PeerMonitor::configuredSilence());  // a silent worker host
    front.pending.push_back(std::make_unique<ServerHandshake>(
        std::move(conn), *identities_[front.server], Clock::now() + options_.handshakeTimeout,
        std::move(source)));
  }
}

bool StandaloneServer::makeRoom(Front& front, const std::string& source) {
  std::map<std::string, int64_t> unproven;  // by source, on this port
  for (const auto& hs : front.pending) ++unproven[hs->source()];
  std::string evict;
  switch (limits_->roomFor(unproven, source, connections_.load(), &evict)) {
    case ServerLimits::Room::kFits: return true;
    case ServerLimits::Room::kFull: return false;
    case ServerLimits::Room::kEvict: break;
  }
  auto oldest = std::find_if(front.pending.begin(), front.pending.end(),
                             [&](const auto& hs) { return hs->source() == evict; });
  noteError(front.who + ": dropped the oldest connection from " + evict +
            " still owing its proof, to make room " + limits_->roomSettings());
  front.pending.erase(oldest);
  return true;
}

std::string StandaloneServer::helloRefusal(const ServerFrame& hello,
                                           const std::string& job) const {
  // The worker's own job id may be named; the one this server serves
  // (--job) is not told to anyone.
  if (!options_.job.empty() && job != options_.job) {
    return "this server does not serve job '" + job + "' (SMDDP_SERVER_JOB)";
  }
  if (requireIntegrity_ && !(hello.flags & kServerFlagIntegrity)) {
    return "this server requires SMDDP_SERVER_INTEGRITY=1 on its workers (the default; this "
           "worker turned it off)";
  }
  const bool encrypt = hello.flags & kServerFlagEncrypt;
  if (encrypt_ && !encrypt) {
    return "this server encrypts its wire (SMDDP_WIRE_ENCRYPT=1) and this worker does not: set "
           "SMDDP_WIRE_ENCRYPT=1 on the workers too";
  }
  if (encrypt && !encrypt_) {
    return "this worker asks for SMDDP_WIRE_ENCRYPT=1 and this server was started without it: "
           "set it on the server too, or unset it on the workers";
  }
  return "";
}

std::shared_ptr<StandaloneServer::Waiting>& StandaloneServer::waitingStream(
    Front& front, const ServerFrame& hello) {
  // A new stream is built whole before it is listed: a throw (no memory
  // for its hosts) must not leave a stream with fewer slots than hosts.
  const std::pair<uint64_t, int> id{hello.group, static_cast<int>(hello.stream)};
  auto found = front.waiting.find(id);
  if (found == front.waiting.end()) {
    auto fresh = std::make_shared<Waiting>(limits_->reserved());
    fresh->group = hello.group;
    fresh->stream = hello.stream;
    fresh->hosts = hello.hosts;
    fresh->members.resize(hello.hosts);
    found = front.waiting.emplace(id, std::move(fresh)).first;
    streams_++;
  }
  return found->second;
}

void StandaloneServer::admit(Front& front, ServerHandshake& hs) {
  const ServerFrame hello = hs.hello();
  const int host = hello.host, hosts = hello.hosts;
  StreamHost joining;
  joining.conn = hs.release();
  joining.rank = static_cast<int>(hello.seq);
  joining.maxPiece = hello.count;
  const bool integrity = hello.flags & kServerFlagIntegrity;
  // Sealed as the worker asked, even where this server refuses it: the
  // worker can read why.
  const bool encrypt = hello.flags & kServerFlagEncrypt;
  if (integrity) {
    joining.check =
        std::make_unique<FrameSeal>(hs.sessionKey(), SealDirection::kToServer, encrypt);
    joining.seal = std::make_unique<FrameSeal>(hs.sessionKey(), SealDirection::kToWorker, encrypt);
  }
  const int fd = joining.conn.fd();
  // From here the worker has proved it holds the key: it may hear why.
  auto refuse = [&](const std::string& why) {
    writeTextFrame(fd, errorFrame(), front.who + " refused the connection: " + why,
                   Clock::now() + std::chrono::seconds(1), joining.seal.get());
    noteError(front.who + ": refused a connection: " + why);
  };
  std::string why = helloRefusal(hello, hs.job());
  std::unique_ptr<HostGrant> granted;
  if (why.empty()) why = limits_->grant(hello, hs.job(), &granted);
  if (!why.empty()) return refuse(why);
  const uint64_t group = hello.group;
  std::shared_ptr<Waiting>& w = waitingStream(front, hello);
  if (w->hosts != hosts) {
    why = "host " + std::to_string(host) + " says the group has " + std::to_string(hosts) +
          " hosts, an earlier one said " + std::to_string(w->hosts);
  } else if (w->members[host].conn) {
    why = "host " + std::to_string(host) + " of stream " + std::to_string(hello.stream) +
          " joined twice";
  }
  if (why.empty()) {
    ServerFrame welcome;
    welcome.kind = static_cast<uint8_t>(ServerFrameKind::kWelcome);
    welcome.flags = hello.flags & (kServerFlagIntegrity | kServerFlagEncrypt);
    why = writeTextFrame(fd, welcome, "", Clock::now() + std::chrono::seconds(1),
                         joining.seal.get());
    if (!why.empty()) joining.conn.reset();  // it went away: nobody to tell
  }
  if (!why.empty()) {
    if (joining.conn) refuse(why);
    if (w->joined == 0) {  // the stream it would have opened
      front.waiting.erase({group, static_cast<int>(hello.stream)});
      streams_--;
    }
    return;
  }
  // An incomplete stream lives as long as its hosts said they would wait
  // for each other (SMDDP_SERVER_WAIT), at most SMDDP_SERVER_MAX_WAIT, and
  // a grace more.
  const auto wait = std::chrono::milliseconds(
      std::min<uint64_t>(hello.step, static_cast<uint64_t>(options_.maxWait.count())));
  // (A stream one of whose hosts already hung up stays marked to go.)
  if (w->expires != Clock::time_point::min()) {
    w->expires = std::max(w->expires, Clock::now() + wait + options_.streamGrace);
  }
  w->members[host] = std::move(joining);
  w->bytes += granted->bytes.release();
  w->slots.push_back(std::move(granted->slot));
  if (++w->joined < w->hosts) return;
  auto complete = std::move(w);
  front.waiting.erase({group, static_cast<int>(hello.stream)});
  startServing(front.server, std::move(complete));
}

void StandaloneServer::startServing(int server, std::shared_ptr<Waiting> stream) {
  const std::string who = "standalone reduction server " + std::to_string(server);
  std::string failed;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_.load()) {
      streams_--;
      return;  // its connections close with it
    }
    try {
      threads_.emplace_back([this, who, stream] {
        nameThisThread("smddp-stream");
        const std::string why =
            serveStream(who, stream->group, stream->members, stop_, {pieces_, bytes_});
        if (!why.empty()) noteError(who + ": " + why);
        stream->members.clear();  // closes the connections
        streams_--;
        std::lock_guard<std::mutex> done(mu_);
        finished_.push_back(std::this_thread::get_id());
      });
    } catch (const std::exception& e) {
      // No thread (RLIMIT_NPROC, memory): this stream is refused, the
      // server goes on.
      failed = e.what();
    }
  }
  if (failed.empty()) return;
  tellStreamHosts(stream->members, who + ": the server cannot start a thread for this stream (" +
                                       failed + ")");
  noteError(who + ": cannot start a thread for a stream: " + failed);
  streams_--;
}

}  // namespace smddp
