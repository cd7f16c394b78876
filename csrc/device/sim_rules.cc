#include "device/sim_rules.h"

#include <deque>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "device/sim_device.h"

namespace smddp {

namespace {

struct Record {
  std::mutex mu;
  std::vector<std::string> violations;  // guarded by mu
  std::set<int> contexts;               // guarded by mu
  std::deque<std::pair<std::shared_ptr<void>, size_t>> quarantine;  // guarded by mu
  size_t quarantined = 0;                                           // guarded by mu
  std::deque<std::pair<uintptr_t, size_t>> copySources;             // guarded by mu: the last kCopyLog
};
constexpr size_t kQuarantineBytes = 64 << 20;
constexpr size_t kCopyLog = 4096;

Record& record() {
  // Never destroyed: queue threads of process-wide devices run until exit.
  static Record* r = std::make_unique<Record>().release();
  return *r;
}

}  // namespace

namespace sim_rules {

void violate(const std::string& what) {
  keepViolation(what);
  SMDDP_LOG(kError) << "smddp: simulated device rule broken: " << what;
  throwError(ErrorKind::kInternal, "smddp: simulated device rule broken: " + what);
}

void noteViolation(const std::string& what) {
  try {
    violate(what);
  } catch (const Error&) {
  }
}

void keepViolation(const std::string& what) {
  std::lock_guard<std::mutex> lk(record().mu);
  record().violations.push_back(what);
}

void noteContext(int index) {
  std::lock_guard<std::mutex> lk(record().mu);
  record().contexts.insert(index);
}

bool hasContext(int index) {
  std::lock_guard<std::mutex> lk(record().mu);
  return record().contexts.count(index) > 0;
}

void quarantine(std::shared_ptr<void> memory, size_t bytes) {
  std::lock_guard<std::mutex> lk(record().mu);
  auto& r = record();
  r.quarantine.emplace_back(std::move(memory), bytes);
  r.quarantined += bytes;
  while (r.quarantined > kQuarantineBytes && r.quarantine.size() > 1) {
    r.quarantined -= r.quarantine.front().second;
    r.quarantine.pop_front();
  }
}

bool quarantined(uintptr_t p, size_t bytes) {
  std::lock_guard<std::mutex> lk(record().mu);
  for (const auto& [mem, size] : record().quarantine) {
    const auto base = reinterpret_cast<uintptr_t>(mem.get());
    if (p < base + size && base < p + bytes) return true;
  }
  return false;
}

void noteCopy(uintptr_t src, size_t bytes) {
  std::lock_guard<std::mutex> lk(record().mu);
  auto& log = record().copySources;
  log.emplace_back(src, bytes);
  if (log.size() > kCopyLog) log.pop_front();
}

std::string threadName() {
  std::ostringstream s;
  s << std::this_thread::get_id();
  return s.str();
}

}  // namespace sim_rules

namespace sim {

uint64_t copiesFrom(const void* begin, size_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(begin);
  std::lock_guard<std::mutex> lk(record().mu);
  uint64_t n = 0;
  for (const auto& [src, size] : record().copySources) n += src < b + bytes && b < src + size;
  return n;
}

void recordViolation(const std::string& what) { sim_rules::noteViolation(what); }

std::vector<int> contexts() {
  std::lock_guard<std::mutex> lk(record().mu);
  return {record().contexts.begin(), record().contexts.end()};
}

std::vector<std::string> violations() {
  std::lock_guard<std::mutex> lk(record().mu);
  return record().violations;
}

void clearViolations() {
  std::lock_guard<std::mutex> lk(record().mu);
  record().violations.clear();
}

}  // namespace sim

}  // namespace smddp
