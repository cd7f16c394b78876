#include "observe/flight_recorder.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "common/dtype.h"
#include "common/param.h"
#include "observe/torch_fr.h"

namespace smddp {

SMDDP_PARAM_INT(paramTraceBufferSize, "SMDDP_TRACE_BUFFER_SIZE", 2000, 0, 10000000,
                "collectives each group's flight recorder keeps (0: no recorder, no desync report); "
                "TORCH_FR_BUFFER_SIZE is its alias, read where this one is unset")
SMDDP_PARAM_INT(paramTorchBufferSize, "TORCH_FR_BUFFER_SIZE", 2000, 0, 10000000,
                "torch's name for SMDDP_TRACE_BUFFER_SIZE (which wins where both are set)")
SMDDP_PARAM_STRING(paramDebugDir, "SMDDP_DEBUG_DIR", "",
                   "directory where each rank dumps its flight recorder "
                   "(smddp_trace_rank<R>_g<group>.json) when a call fails or a peer asks for a "
                   "desync report; empty = no dumps")

int64_t traceBufferSize() {
  const char* own = getenv("SMDDP_TRACE_BUFFER_SIZE");
  if ((!own || !*own) && getenv("TORCH_FR_BUFFER_SIZE")) return paramTorchBufferSize();
  return paramTraceBufferSize();
}
std::string debugDir() { return paramDebugDir(); }

const char* toString(CallState s) {
  switch (s) {
    case CallState::kQueued: return "issued, not started";
    case CallState::kStarted: return "started";
    case CallState::kCompleted: return "completed";
    case CallState::kFailed: return "failed";
  }
  return "?";
}

const char* toString(CallPath p) {
  switch (p) {
    case CallPath::kUnknown: return "";
    case CallPath::kSharedMemory: return "shared-memory";
    case CallPath::kHierarchy: return "hierarchy";
    case CallPath::kNetwork: return "network";
  }
  return "?";
}

std::string FlightEntry::describe() const { return hasSignature ? sig.describe() : "barrier"; }

uint64_t FlightEntry::bytes() const {
  return hasSignature ? sig.numel * elementSize(sig.dtype) : 0;
}

std::string humanBytes(uint64_t b) {
  char buf[32];
  if (b < 1000) snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  else if (b < 1000000) snprintf(buf, sizeof(buf), "%.1f kB", b / 1e3);
  else if (b < 1000000000) snprintf(buf, sizeof(buf), "%.1f MB", b / 1e6);
  else snprintf(buf, sizeof(buf), "%.1f GB", b / 1e9);
  return buf;
}

namespace {

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string jsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      snprintf(b, sizeof(b), "\\u%04x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// "rank 3", "ranks 0-2", "ranks 0, 2, 5-7".
std::string rankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

std::string RankPosition::serialize() const {
  std::ostringstream o;
  o << "v1\n" << static_cast<int>(kind) << "\n" << idle << "\n" << any << "\n" << seq << "\n"
    << bytes << "\n" << state << "\n" << call;
  return o.str();
}

RankPosition RankPosition::parse(int rank, const std::string& text) {
  RankPosition p;
  p.rank = rank;
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> f;
  while (std::getline(in, line)) f.push_back(line);
  if (f.size() < 8 || f[0] != "v1") return p;  // unreadable: unreachable
  try {
    int k = std::stoi(f[1]);
    if (k < 0 || k > static_cast<int>(Kind::kNoRecorder)) return p;
    p.kind = static_cast<Kind>(k);
    p.idle = f[2] == "1";
    p.any = f[3] == "1";
    p.seq = std::stoull(f[4]);
    p.bytes = std::stoull(f[5]);
  } catch (const std::exception&) {
    p.kind = Kind::kUnreachable;
    return p;
  }
  p.state = f[6];
  p.call = f[7];
  for (size_t i = 8; i < f.size(); ++i) p.call += "\n" + f[i];
  return p;
}

std::string formatDesyncReport(std::vector<RankPosition> positions) {
  // Ranks that stand at the same place are named together.
  struct Place {
    RankPosition::Kind kind;
    bool idle, any;
    uint64_t seq;
    std::string state, call;
    auto key() const { return std::tie(kind, idle, any, seq, state, call); }
    bool operator<(const Place& o) const {
      // Known places by sequence first, then the ranks that said nothing.
      if (kind != o.kind) return kind < o.kind;
      if (seq != o.seq) return seq < o.seq;
      return key() < o.key();
    }
  };
  std::map<Place, std::pair<std::vector<int>, uint64_t>> places;
  for (const RankPosition& p : positions) {
    Place k{p.kind, p.idle, p.any, p.seq, p.state, p.call};
    if (p.kind != RankPosition::Kind::kKnown) k = Place{p.kind, false, false, 0, "", ""};
    auto& v = places[k];
    v.first.push_back(p.rank);
    v.second = p.bytes;
  }
  std::vector<std::string> parts;
  for (const auto& [k, v] : places) {
    const std::string who = rankList(v.first);
    const bool one = v.first.size() == 1;
    const std::string what = k.call + ", " + humanBytes(v.second);
    switch (k.kind) {
      case RankPosition::Kind::kKnown:
        if (!k.any) {
          parts.push_back(who + (one ? " has" : " have") + " issued no collective yet");
        } else if (k.idle) {
          parts.push_back(who + (one ? " has" : " have") + " finished sequence " +
                          std::to_string(k.seq) + " (" + what + ", " + k.state +
                          ") and issued nothing after it");
        } else if (k.state == toString(CallState::kQueued)) {
          parts.push_back(who + (one ? " is" : " are") + " at sequence " + std::to_string(k.seq) +
                          " (" + what + ", " + k.state + ")");
        } else {
          parts.push_back(who + (one ? " waits" : " wait") + " at sequence " +
                          std::to_string(k.seq) + " (" + what + ", " + k.state + ")");
        }
        break;
      case RankPosition::Kind::kUnreachable:
        parts.push_back(who + " could not be reached");
        break;
      case RankPosition::Kind::kLost:
        parts.push_back(who + (one ? " is" : " are") + " lost (process died or host silent)");
        break;
      case RankPosition::Kind::kNoRecorder:
        parts.push_back(who + " keep" + (one ? "s" : "") +
                        " no flight record (SMDDP_TRACE_BUFFER_SIZE=0)");
        break;
    }
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out;
}

FlightRecorder::FlightRecorder(std::string group, int rank, int size, size_t capacity)
    : group_(std::move(group)), rank_(rank), size_(size), ring_(std::max<size_t>(capacity, 1)) {
  for (auto& e : ring_) e.seq = UINT64_MAX;  // empty
}

void FlightRecorder::setTorchGroup(std::string desc, std::vector<int> globalRanks) const {
  std::lock_guard<std::mutex> lock(mu_);
  torchDesc_ = std::move(desc);
  // One global rank per rank of the group, or none (then 0 .. size - 1):
  // torchRanks() reads one per rank.
  if (globalRanks.size() == static_cast<size_t>(size_)) {
    globalRanks_ = std::move(globalRanks);
  } else {
    globalRanks_.clear();
  }
}

std::string FlightRecorder::torchDesc() const {
  std::lock_guard<std::mutex> lock(mu_);
  return torchDesc_;
}

std::string FlightRecorder::torchRanks() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "[";
  for (int r = 0; r < size_; ++r) {
    if (r) out += ", ";
    out += std::to_string(globalRanks_.empty() ? r : globalRanks_[static_cast<size_t>(r)]);
  }
  return out + "]";
}

FlightEntry* FlightRecorder::slot(uint64_t seq) {
  FlightEntry& e = ring_[seq % ring_.size()];
  return e.seq == seq ? &e : nullptr;
}

namespace {
int64_t nsOf(FlightRecorder::TimePoint t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

void FlightRecorder::queued(uint64_t seq, const CollectiveSignature* sig, TimePoint at) {
  const int64_t now = nsOf(at);
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry& e = ring_[seq % ring_.size()];
  e.seq = seq;
  e.hasSignature = sig != nullptr;
  if (sig) e.sig = *sig;
  e.state = CallState::kQueued;
  e.path = CallPath::kUnknown;
  e.batch = seq;
  e.batchCalls = 0;
  e.onCaller = false;
  e.queuedNs = now;
  e.startedNs = e.endedNs = 0;
  e.error.clear();
  next_ = std::max(next_, seq + 1);
}

void FlightRecorder::started(uint64_t seq, CallPath path, uint64_t batch, bool onCaller,
                             TimePoint at) {
  const int64_t now = nsOf(at);
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry* e = slot(seq);
  if (!e) return;
  e->state = CallState::kStarted;
  e->path = path;
  e->batch = batch;
  e->onCaller = onCaller;
  e->startedNs = now;
}

void FlightRecorder::ended(uint64_t seq, const std::string* error, uint32_t batchCalls,
                           TimePoint at) {
  const int64_t now = nsOf(at);
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry* e = slot(seq);
  if (!e) return;
  if (!e->startedNs) e->startedNs = now;  // failed before it ran (shutdown, broken group)
  e->endedNs = now;
  e->batchCalls = batchCalls;
  e->state = error ? CallState::kFailed : CallState::kCompleted;
  if (error) e->error = error->substr(0, error->find('\n'));
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEntry> out;
  const uint64_t n = ring_.size();
  const uint64_t first = next_ > n ? next_ - n : 0;
  for (uint64_t s = first; s < next_; ++s) {
    const FlightEntry& e = ring_[s % n];
    if (e.seq == s) out.push_back(e);
  }
  return out;
}

void FlightRecorder::notePosition(const std::string& serialized) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reported_.empty()) reported_ = serialized;
}

RankPosition FlightRecorder::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return positionLocked();
}

RankPosition FlightRecorder::positionLocked() const {
  RankPosition p;
  p.rank = rank_;
  p.kind = RankPosition::Kind::kKnown;
  const uint64_t n = ring_.size();
  const uint64_t first = next_ > n ? next_ - n : 0;
  const FlightEntry* at = nullptr;
  for (uint64_t s = first; s < next_ && !at; ++s) {
    const FlightEntry& e = ring_[s % n];
    if (e.seq == s && (e.state == CallState::kQueued || e.state == CallState::kStarted)) at = &e;
  }
  p.idle = at == nullptr;
  if (!at && next_ > 0) {
    const FlightEntry& last = ring_[(next_ - 1) % n];
    if (last.seq == next_ - 1) at = &last;
  }
  if (!at) return p;  // nothing issued yet
  p.any = true;
  p.seq = at->seq;
  p.call = at->describe();
  p.bytes = at->bytes();
  p.state = toString(at->state);
  return p;
}

std::string FlightRecorder::toJson() const {
  const auto steadyNow = steadyNs();
  const auto wallNowUs = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  auto wall = [&](int64_t ns) -> long long {
    return ns ? static_cast<long long>(wallNowUs - (steadyNow - ns) / 1000) : 0;
  };
  std::vector<FlightEntry> es = entries();
  std::string pos;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pos = reported_.empty() ? positionLocked().serialize() : reported_;
  }
  std::ostringstream o;
  o << "{\"group\": \"" << jsonEscape(group_) << "\", \"rank\": " << rank_
    << ", \"size\": " << size_ << ", \"position\": \"" << jsonEscape(pos)
    << "\", \"entries\": [";
  for (size_t i = 0; i < es.size(); ++i) {
    const FlightEntry& e = es[i];
    o << (i ? ",\n  " : "\n  ") << "{\"seq\": " << e.seq << ", \"collective\": \""
      << (e.hasSignature ? toString(e.sig.collective) : "barrier") << "\", \"call\": \""
      << jsonEscape(e.describe()) << "\"";
    if (e.hasSignature) {
      o << ", \"dtype\": \"" << toString(e.sig.dtype) << "\", \"op\": \"" << toString(e.sig.op)
        << "\", \"numel\": " << e.sig.numel << ", \"root\": " << e.sig.root;
    }
    o << ", \"bytes\": " << e.bytes() << ", \"state\": \"" << toString(e.state)
      << "\", \"path\": \"" << toString(e.path) << "\", \"batch\": " << e.batch
      << ", \"batch_calls\": " << e.batchCalls << ", \"on_caller\": "
      << (e.onCaller ? "true" : "false") << ", \"queued_us\": " << wall(e.queuedNs)
      << ", \"started_us\": " << wall(e.startedNs) << ", \"ended_us\": " << wall(e.endedNs);
    if (!e.error.empty()) o << ", \"error\": \"" << jsonEscape(e.error) << "\"";
    o << "}";
  }
  o << "]}";
  return o.str();
}

std::string dumpFlightRecord(const FlightRecorder& rec, const std::string& reason) {
  int globalRank = rec.rank();
  if (const char* r = getenv("RANK")) {
    char* end = nullptr;
    long v = strtol(r, &end, 10);
    if (end && *end == '\0' && v >= 0) globalRank = static_cast<int>(v);
  }
  (void)dumpTorchFlightRecord(globalRank);
  const std::string dir = debugDir();
  if (dir.empty()) return "";
  std::string tag;
  for (char c : rec.group()) tag += (isalnum(static_cast<unsigned char>(c)) ? c : '_');
  const std::string path = dir + "/smddp_trace_rank" + std::to_string(globalRank) + "_g" + tag +
                           ".json";
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  std::string body = rec.toJson();
  // {"reason": ..., "pid": ..., ...the recorder's object...}
  body = "{\"reason\": \"" + jsonEscape(reason) + "\", \"pid\": " + std::to_string(getpid()) +
         ", \"global_rank\": " + std::to_string(globalRank) + ", " + body.substr(1) + "\n";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) return "";
  const bool ok = fwrite(body.data(), 1, body.size(), f) == body.size();
  if (fclose(f) != 0 || !ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return "";
  }
  return path;
}

}  // namespace smddp
