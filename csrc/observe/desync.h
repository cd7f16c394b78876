// The desync report: when a call times out (which leaves the group
// unusable), the failing rank asks every rank through the store where it stands, and
// its error says which ranks are behind, on which call. Each rank keeps one
// thread blocked on its own request key to answer, whatever its engine and
// its Python code are doing (the rank behind is usually not in any call).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "observe/flight_recorder.h"
#include "transport/bootstrap.h"

namespace smddp {

class DesyncResponder {
 public:
  // `waitStore` is a clone of the group's store with a connection of its
  // own (a thread blocks in it); `askStore` may share the group's
  // connection. `prefix` is the group instance's key prefix.
  DesyncResponder(std::unique_ptr<Bootstrap> waitStore, std::unique_ptr<Bootstrap> askStore,
                  std::string prefix, std::shared_ptr<FlightRecorder> recorder);
  // Wakes the answering thread and joins it, or leaves it behind after
  // 200 ms if the store does not answer (it then touches only its own state,
  // which it co-owns).
  ~DesyncResponder();
  DesyncResponder(const DesyncResponder&) = delete;
  DesyncResponder& operator=(const DesyncResponder&) = delete;

  // Asks every rank where it stands and formats the report. Ranks for which
  // `lost(r)` is true are named lost without being asked; the others have
  // `budget` to answer. Never blocks longer than about `budget`, even on a
  // store that hangs. Also dumps this rank's record (SMDDP_DEBUG_DIR).
  std::string collect(std::chrono::milliseconds budget, const std::function<bool(int)>& lost,
                      const std::string& reason);

  // At an orderly shutdown, on the rank that usually hosts the store (rank
  // 0, when the job was not launched by torchrun, whose agent holds it):
  // waits, up to `bound`, until every peer that `lost` does not name has
  // stopped its answering thread. A store whose host exits while a peer's
  // thread still waits in it makes that peer's TCPStore print a warning
  // with a stack ("recvValue failed ... Connection was likely closed").
  void awaitPeersStopped(std::chrono::milliseconds bound, const std::function<bool(int)>& lost);

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  std::thread answerer_;
};

}  // namespace smddp
