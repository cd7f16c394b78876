// The stand-in device's rule checker (sim_device.h): the process's record
// of rules broken, contexts made, page-locked memory freed and the sources
// of recent copies. The queues (sim_device.cc) report here as they run;
// sim::violations(), contexts() and copiesFrom() read it back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace smddp::sim_rules {

// A rule broken: kept in violations(), logged, and thrown (kInternal).
[[noreturn]] void violate(const std::string& what);
// The same where nothing can throw (queue threads): kept and logged.
void noteViolation(const std::string& what);
// The same from a destructor: kept only.
void keepViolation(const std::string& what);

// A context on device `index` (setting it, queuing work, allocating).
void noteContext(int index);
bool hasContext(int index);

// Page-locked memory its owner freed: kept (never handed out again) up to
// 64 MiB, so that a late copy into it is seen, not a crash.
void quarantine(std::shared_ptr<void> memory, size_t bytes);
// Whether [p, p + bytes) overlaps memory in the quarantine.
bool quarantined(uintptr_t p, size_t bytes);

// A copy from [src, src + bytes), kept among the last 4096.
void noteCopy(uintptr_t src, size_t bytes);

// The calling thread's id, for messages.
std::string threadName();

}  // namespace smddp::sim_rules
