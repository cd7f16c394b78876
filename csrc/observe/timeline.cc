#include "observe/timeline.h"

#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "common/dtype.h"
#include "common/logging.h"
#include "common/param.h"

namespace smddp::timeline {

SMDDP_PARAM_STRING(paramTimeline, "SMDDP_TIMELINE", "",
                   "write a Chrome/Perfetto trace-event JSON file per rank to this path "
                   "(\"{rank}\" is replaced by the rank, else .rank<R> goes before .json)")

std::atomic<bool> gOn{false};

namespace {

constexpr size_t kBufferEvents = 8192;       // flushed when full
constexpr int64_t kFlushEveryNs = 1000000000;  // and at most this long after the last write

enum class Kind : uint8_t { kIssued, kCall, kRan, kBatch, kPhase };

// One buffered event: fixed size, no allocation to record it.
struct Event {
  Kind kind;
  uint8_t collective;
  uint8_t dtype;
  uint8_t op;
  uint8_t phase;
  bool flag;  // call: ok; batch: small
  uint16_t group;
  uint32_t tid;
  uint32_t count;  // batch: calls
  int32_t root;
  int64_t beginNs;
  int64_t endNs;
  uint64_t seq;   // call seq; batch: first seq; phase: batch index
  uint64_t a;     // call: numel; batch: index; phase: first step
  uint64_t b;     // bytes
  uint64_t c;     // phase: end step
  const char* path;
};

struct Recorder {
  std::mutex mu;
  bool configured = false;
  int rank = 0;
  std::string file;
  FILE* out = nullptr;
  bool wroteEvent = false;  // the file holds an event: the next one needs a comma
  int64_t offsetNs = 0;     // CLOCK_REALTIME - steady_clock, taken once
  int64_t lastFlushNs = 0;
  std::vector<Event> events;
  std::vector<std::string> groups;
  std::vector<std::string> threads;  // by tid - 1
  size_t threadsWritten = 0;         // thread_name metadata already in the file
  int callers = 0;
};

Recorder& rec() {
  static Recorder* r = new Recorder();  // never destroyed: exit-time flushes may use it
  return *r;
}

thread_local uint32_t tTid = 0;
thread_local std::string tName;  // set by nameThread before the first event

// Under rec().mu.
uint32_t tidLocked(Recorder& r) {
  if (tTid == 0) {
    std::string name = tName;
    if (name.empty()) {
      ++r.callers;
      name = r.callers == 1 ? "caller" : "caller " + std::to_string(r.callers);
    }
    r.threads.push_back(std::move(name));
    tTid = static_cast<uint32_t>(r.threads.size());
  }
  return tTid;
}

uint16_t groupLocked(Recorder& r, const std::string& g) {
  for (size_t i = 0; i < r.groups.size(); ++i) {
    if (r.groups[i] == g) return static_cast<uint16_t>(i);
  }
  r.groups.push_back(g);
  return static_cast<uint16_t>(r.groups.size() - 1);
}

std::string jsonString(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (u < 0x20) {
      char b[8];
      snprintf(b, sizeof(b), "\\u%04x", u);
      o += b;
    } else {
      o += ch;
    }
  }
  return o + "\"";
}

const char* phaseName(uint8_t p) {
  switch (static_cast<Phase>(p)) {
    case Phase::kCut: return "plan";
    case Phase::kCopyIn: return "copy in";
    case Phase::kCombine: return "combine";
    case Phase::kCopyOut: return "copy out";
  }
  return "?";
}

// Writes `text` as the next element of the file's array (under rec().mu).
void emitLocked(Recorder& r, const std::string& text) {
  fputs(r.wroteEvent ? ",\n" : "\n", r.out);
  fputs(text.c_str(), r.out);
  r.wroteEvent = true;
}

std::string us(int64_t ns) {
  char b[32];
  snprintf(b, sizeof(b), "%.3f", static_cast<double>(ns) / 1000.0);
  return b;
}

std::string head(Recorder& r, const char* ph, const std::string& name, const char* cat,
                 uint32_t tid, int64_t tsNs) {
  return std::string("{\"ph\":\"") + ph + "\",\"name\":" + jsonString(name) + ",\"cat\":\"" + cat +
         "\",\"pid\":" + std::to_string(r.rank) + ",\"tid\":" + std::to_string(tid) +
         ",\"ts\":" + us(tsNs);
}

std::string callArgs(Recorder& r, const Event& e) {
  const auto dt = static_cast<DataType>(e.dtype);
  std::string s = ",\"args\":{\"group\":" + jsonString(r.groups[e.group]) +
                  ",\"seq\":" + std::to_string(e.seq) + ",\"collective\":\"" +
                  toString(static_cast<CollectiveType>(e.collective)) + "\"";
  if (static_cast<CollectiveType>(e.collective) != CollectiveType::kBarrier) {
    s += std::string(",\"dtype\":\"") + toString(dt) + "\"";
    if (e.collective == static_cast<uint8_t>(CollectiveType::kAllreduce) ||
        e.collective == static_cast<uint8_t>(CollectiveType::kReduce) ||
        e.collective == static_cast<uint8_t>(CollectiveType::kReduceScatter)) {
      s += std::string(",\"op\":\"") + toString(static_cast<ReduceOp>(e.op)) + "\"";
    }
    if (e.root >= 0) s += ",\"root\":" + std::to_string(e.root);
  }
  s += ",\"numel\":" + std::to_string(e.a) + ",\"bytes\":" + std::to_string(e.b);
  return s;
}

void writeEventLocked(Recorder& r, const Event& e) {
  const std::string g = jsonString(r.groups[e.group]);
  const char* coll = toString(static_cast<CollectiveType>(e.collective));
  switch (e.kind) {
    case Kind::kIssued:
      emitLocked(r, head(r, "i", std::string("issue ") + coll, "issue", e.tid, e.beginNs) +
                        ",\"s\":\"t\"" + callArgs(r, e) + "}}");
      break;
    case Kind::kCall: {
      // An async span (calls overlap without nesting): begin and end share
      // an id, per group and sequence.
      const std::string id = ",\"id\":\"" + std::to_string(e.group) + ":" +
                             std::to_string(e.seq) + "\"";
      emitLocked(r, head(r, "b", coll, "collective", e.tid, e.beginNs) + id + callArgs(r, e) +
                        ",\"path\":\"" + e.path + "\"}}");
      emitLocked(r, head(r, "e", coll, "collective", e.tid, e.endNs) + id +
                        ",\"args\":{\"ok\":" + (e.flag ? "true" : "false") + "}}");
      break;
    }
    case Kind::kRan:
      emitLocked(r, head(r, "X", std::string("run ") + coll, "run", e.tid, e.beginNs) +
                        ",\"dur\":" + us(e.endNs - e.beginNs) + callArgs(r, e) + "}}");
      break;
    case Kind::kBatch: {
      std::string seqs;
      for (uint32_t i = 0; i < e.count; ++i) {
        seqs += (i ? "," : "") + std::to_string(e.seq + i);
      }
      emitLocked(r, head(r, "X", "fusion batch", "batch", e.tid, e.beginNs) +
                        ",\"dur\":" + us(e.endNs - e.beginNs) + ",\"args\":{\"group\":" + g +
                        ",\"batch\":" + std::to_string(e.a) + ",\"seqs\":[" + seqs +
                        "],\"calls\":" + std::to_string(e.count) +
                        ",\"bytes\":" + std::to_string(e.b) +
                        ",\"small\":" + (e.flag ? "true" : "false") + "}}");
      break;
    }
    case Kind::kPhase:
      emitLocked(r, head(r, "X", phaseName(e.phase), "shm", e.tid, e.beginNs) +
                        ",\"dur\":" + us(e.endNs - e.beginNs) + ",\"args\":{\"group\":" + g +
                        ",\"batch\":" + std::to_string(e.seq) +
                        ",\"first_step\":" + std::to_string(e.a) +
                        ",\"end_step\":" + std::to_string(e.c) +
                        ",\"bytes\":" + std::to_string(e.b) + "}}");
      break;
  }
}

void flushLocked(Recorder& r) {
  if (!r.out) return;
  for (; r.threadsWritten < r.threads.size(); ++r.threadsWritten) {
    const uint32_t tid = static_cast<uint32_t>(r.threadsWritten + 1);
    emitLocked(r, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(r.rank) +
                      ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":" +
                      jsonString(r.threads[r.threadsWritten]) + "}}");
    emitLocked(r, "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" +
                      std::to_string(r.rank) + ",\"tid\":" + std::to_string(tid) +
                      ",\"args\":{\"sort_index\":" + std::to_string(tid) + "}}");
  }
  for (const Event& e : r.events) writeEventLocked(r, e);
  r.events.clear();
  // Close the array, then step back over the closing bracket so the next
  // write replaces it: the file is complete JSON between writes.
  static const char kTail[] = "\n]\n";
  fputs(kTail, r.out);
  fflush(r.out);
  fseek(r.out, -static_cast<long>(sizeof(kTail) - 1), SEEK_END);
  r.lastFlushNs = nowNs();
}

void pushLocked(Recorder& r, Event& e) {
  e.tid = tidLocked(r);
  r.events.push_back(e);
  if (r.events.size() >= kBufferEvents || e.endNs - r.lastFlushNs > kFlushEveryNs) flushLocked(r);
}

Event callEvent(Kind kind, Recorder& r, const std::string& group, uint64_t seq,
                const CollectiveSignature& sig) {
  Event e{};
  e.kind = kind;
  e.group = groupLocked(r, group);
  e.seq = seq;
  e.collective = static_cast<uint8_t>(sig.collective);
  e.dtype = static_cast<uint8_t>(sig.dtype);
  e.op = static_cast<uint8_t>(sig.op);
  e.root = sig.root;
  e.a = sig.numel;
  e.b = sig.collective == CollectiveType::kBarrier ? 0 : sig.numel * elementSize(sig.dtype);
  return e;
}

}  // namespace

std::string pathFor(const std::string& pattern, int rank) {
  const std::string r = std::to_string(rank);
  const size_t at = pattern.find("{rank}");
  if (at != std::string::npos) {
    std::string p = pattern;
    p.replace(at, 6, r);
    return p;
  }
  const std::string ext = ".json";
  if (pattern.size() >= ext.size() &&
      pattern.compare(pattern.size() - ext.size(), ext.size(), ext) == 0) {
    return pattern.substr(0, pattern.size() - ext.size()) + ".rank" + r + ext;
  }
  return pattern + ".rank" + r;
}

int64_t toNs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count() +
         rec().offsetNs;
}

void configure(int rank) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.configured) return;
  r.configured = true;
  const std::string pattern = paramTimeline();
  if (pattern.empty()) return;
  r.rank = rank;
  r.file = pathFor(pattern, rank);
  r.out = fopen(r.file.c_str(), "w");
  if (!r.out) {
    SMDDP_LOG(kWarn) << "SMDDP_TIMELINE: cannot open " << r.file << " for writing; no timeline";
    return;
  }
  timespec wall{};
  clock_gettime(CLOCK_REALTIME, &wall);
  const int64_t steady = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  r.offsetNs = static_cast<int64_t>(wall.tv_sec) * 1000000000 + wall.tv_nsec - steady;
  r.events.reserve(kBufferEvents);
  fputs("[", r.out);
  emitLocked(r, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(rank) +
                    ",\"args\":{\"name\":\"rank " + std::to_string(rank) + "\"}}");
  emitLocked(r, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + std::to_string(rank) +
                    ",\"args\":{\"sort_index\":" + std::to_string(rank) + "}}");
  flushLocked(r);
  std::atexit([] { flush(); });
  gOn.store(true);
}

std::string path() {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.out ? r.file : std::string();
}

void nameThread(const std::string& name) {
  if (!on()) return;
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (tTid != 0) {
    if (tTid <= r.threads.size() && tTid > r.threadsWritten) r.threads[tTid - 1] = name;
    return;
  }
  tName = name;
  tidLocked(r);
}

void issued(const std::string& group, uint64_t seq, const CollectiveSignature& sig) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.out) return;
  Event e = callEvent(Kind::kIssued, r, group, seq, sig);
  e.beginNs = e.endNs = nowNs();
  pushLocked(r, e);
}

void call(const std::string& group, uint64_t seq, const CollectiveSignature& sig,
          const char* path, int64_t queuedNs, int64_t endNs, bool ok) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.out) return;
  Event e = callEvent(Kind::kCall, r, group, seq, sig);
  e.path = path;
  e.flag = ok;
  e.beginNs = queuedNs;
  e.endNs = endNs;
  pushLocked(r, e);
}

void ran(const std::string& group, uint64_t seq, const CollectiveSignature& sig, int64_t beginNs,
         int64_t endNs) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.out) return;
  Event e = callEvent(Kind::kRan, r, group, seq, sig);
  e.beginNs = beginNs;
  e.endNs = endNs;
  pushLocked(r, e);
}

void batch(const std::string& group, uint64_t index, uint64_t firstSeq, uint32_t calls,
           uint64_t bytes, bool small, int64_t beginNs, int64_t endNs) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.out) return;
  Event e{};
  e.kind = Kind::kBatch;
  e.group = groupLocked(r, group);
  e.seq = firstSeq;
  e.count = calls;
  e.a = index;
  e.b = bytes;
  e.flag = small;
  e.beginNs = beginNs;
  e.endNs = endNs;
  pushLocked(r, e);
}

void phase(Phase p, const std::string& group, uint64_t batchIndex, uint64_t firstStep,
           uint64_t endStep, uint64_t bytes, int64_t beginNs, int64_t endNs) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.out) return;
  Event e{};
  e.kind = Kind::kPhase;
  e.phase = static_cast<uint8_t>(p);
  e.group = groupLocked(r, group);
  e.seq = batchIndex;
  e.a = firstStep;
  e.c = endStep;
  e.b = bytes;
  e.beginNs = beginNs;
  e.endNs = endNs;
  pushLocked(r, e);
}

void flush() {
  if (!on()) return;
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  flushLocked(r);
}

}  // namespace smddp::timeline
