#include "observe/torch_fr.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>

#include "common/param.h"
#include "observe/flight_recorder.h"
#include "observe/pickle_writer.h"

namespace smddp {

SMDDP_PARAM_STRING(paramTorchDumpFile, "TORCH_FR_DUMP_TEMP_FILE", "",
                   "path prefix of flight recorder dumps in torch's format (file <prefix><rank>, "
                   "read by torch's analyzer torchfrtrace), written when a call fails or a peer asks "
                   "for a desync report; empty = none")

std::string torchDumpPrefix() { return paramTorchDumpFile(); }

namespace {

std::mutex gMu;
std::vector<std::weak_ptr<const FlightRecorder>> gRecorders;  // guarded by gMu

// torch's names: the collectives torchfrtrace knows, and c10's dtype names.
const char* torchCollective(CollectiveType c) {
  switch (c) {
    case CollectiveType::kAllreduce: return "all_reduce";
    case CollectiveType::kBroadcast: return "broadcast";
    case CollectiveType::kAllgather: return "all_gather";
    case CollectiveType::kBarrier: return "barrier";
    case CollectiveType::kReduceScatter: return "reduce_scatter";
    case CollectiveType::kAlltoall: return "all_to_all";
    case CollectiveType::kGather: return "gather";
    case CollectiveType::kScatter: return "scatter";
    case CollectiveType::kReduce: return "reduce";
    case CollectiveType::kSendRecv: return "send";
  }
  return "barrier";
}

const char* torchDtype(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "Float";
    case DataType::kFloat64: return "Double";
    case DataType::kFloat16: return "Half";
    case DataType::kBFloat16: return "BFloat16";
    case DataType::kInt8: return "Char";
    case DataType::kUInt8: return "Byte";
    case DataType::kInt32: return "Int";
    case DataType::kInt64: return "Long";
    case DataType::kBool: return "Bool";
    default: return "Byte";
  }
}

// [[n]] as torch writes a one-tensor argument.
void sizes(PickleWriter& w, uint64_t n) {
  w.beginList();
  w.beginList();
  w.integer(static_cast<int64_t>(n));
  w.endList();
  w.endList();
}

void strings(PickleWriter& w, const char* s) {
  w.beginList();
  w.str(s);
  w.endList();
}

struct Clock {
  // Steady-clock ns of the recorder to the system clock's, as torch writes.
  int64_t offset = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count() -
                   std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t wall(int64_t steadyNs) const { return steadyNs ? steadyNs + offset : 0; }
};

void entry(PickleWriter& w, const FlightEntry& e, int64_t recordId, int64_t pgId,
           const FlightRecorder& rec, const Clock& clock) {
  const CollectiveType type = e.hasSignature ? e.sig.collective : CollectiveType::kBarrier;
  const uint64_t n = e.hasSignature ? e.sig.numel : 0;
  const uint64_t world = static_cast<uint64_t>(rec.size());
  // What torchfrtrace checks across ranks: an all-gather's output is world
  // times its input, a reduce-scatter's input world times its output.
  const uint64_t in = type == CollectiveType::kReduceScatter ? n * world : n;
  const uint64_t out = type == CollectiveType::kAllgather ? n * world : n;
  const char* dtype = torchDtype(e.hasSignature ? e.sig.dtype : DataType::kUInt8);
  const bool completed = e.state == CallState::kCompleted;
  const bool started = e.startedNs != 0;
  w.beginDict();
  w.str("record_id"), w.integer(recordId);
  w.str("pg_id"), w.integer(pgId);
  w.str("process_group");
  w.beginTuple();
  w.str(rec.group());
  w.str(rec.torchDesc());
  w.endTuple();
  w.str("collective_seq_id"), w.integer(static_cast<int64_t>(e.seq) + 1);
  w.str("p2p_seq_id"), w.integer(0);
  w.str("op_id"), w.integer(static_cast<int64_t>(e.seq) + 1);
  // torchfrtrace accepts only the names of the backends it knows before
  // the colon; the analysis uses what follows it.
  w.str("profiling_name"), w.str(std::string("gloo:") + torchCollective(type));
  w.str("time_created_ns"), w.integer(clock.wall(e.queuedNs));
  w.str("input_sizes"), sizes(w, in);
  w.str("input_dtypes"), strings(w, dtype);
  w.str("output_sizes"), sizes(w, out);
  w.str("output_dtypes"), strings(w, dtype);
  w.str("state"), w.str(completed ? "completed" : started ? "started" : "scheduled");
  w.str("time_discovered_started_ns"), w.integer(clock.wall(e.startedNs));
  w.str("time_discovered_completed_ns"), w.integer(completed ? clock.wall(e.endedNs) : 0);
  w.str("retired"), w.boolean(completed || e.state == CallState::kFailed);
  w.str("timeout_ms"), w.integer(0);
  w.str("is_p2p"), w.boolean(false);
  w.str("frames");
  w.beginList();
  w.endList();
  w.endDict();
}

std::vector<std::shared_ptr<const FlightRecorder>> live() {
  std::lock_guard<std::mutex> lk(gMu);
  std::vector<std::shared_ptr<const FlightRecorder>> out;
  for (auto it = gRecorders.begin(); it != gRecorders.end();) {
    if (auto r = it->lock()) {
      out.push_back(std::move(r));
      ++it;
    } else {
      it = gRecorders.erase(it);
    }
  }
  return out;
}

}  // namespace

void registerRecorder(const std::shared_ptr<const FlightRecorder>& rec) {
  std::lock_guard<std::mutex> lk(gMu);
  gRecorders.push_back(rec);
}

std::string torchFlightRecordPickle(int globalRank) {
  (void)globalRank;
  const auto recorders = live();
  const Clock clock;
  PickleWriter w;
  w.beginDict();
  w.str("version"), w.str("2.10");
  w.str("comm_lib_version"), w.str("smddp");
  w.str("pg_config");
  w.beginDict();
  for (const auto& r : recorders) {
    w.str(r->group());
    w.beginDict();
    w.str("name"), w.str(r->group());
    w.str("desc"), w.str(r->torchDesc());
    w.str("ranks"), w.str(r->torchRanks());
    w.endDict();
  }
  w.endDict();
  std::vector<std::vector<FlightEntry>> all;
  w.str("pg_status");
  w.beginDict();
  for (size_t g = 0; g < recorders.size(); ++g) {
    all.push_back(recorders[g]->entries());
    int64_t enqueued = 0, started = 0, completed = 0;
    for (const auto& e : all.back()) {
      enqueued = static_cast<int64_t>(e.seq) + 1;
      if (e.startedNs) started = static_cast<int64_t>(e.seq) + 1;
      if (e.state == CallState::kCompleted) completed = static_cast<int64_t>(e.seq) + 1;
    }
    w.str(std::to_string(g));
    w.beginDict();
    w.str("last_enqueued_collective"), w.integer(enqueued);
    w.str("last_started_collective"), w.integer(started);
    w.str("last_completed_collective"), w.integer(completed);
    w.endDict();
  }
  w.endDict();
  w.str("entries");
  w.beginList();
  int64_t id = 0;
  for (size_t g = 0; g < recorders.size(); ++g) {
    for (const auto& e : all[g]) entry(w, e, id++, static_cast<int64_t>(g), *recorders[g], clock);
  }
  w.endList();
  w.endDict();
  return w.finish();
}

std::string dumpTorchFlightRecord(int globalRank) {
  const std::string prefix = torchDumpPrefix();
  if (prefix.empty()) return "";
  const std::string path = prefix + std::to_string(globalRank);
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  const std::string body = torchFlightRecordPickle(globalRank);
  FILE* f = fopen(tmp.c_str(), "wb");
  if (!f) return "";
  const bool ok = fwrite(body.data(), 1, body.size(), f) == body.size();
  if (fclose(f) != 0 || !ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return "";
  }
  return path;
}

}  // namespace smddp
