// The device path's private host-only group (device_collectives.h),
// formed on a thread of its own, so that creating a group on a machine
// with a GPU waits for one rendezvous, not two: the host group forms while
// the caller goes on, and the device path's host work waits for it.
//
// It starts as soon as its group has formed, on every rank, so it always
// completes: a first device call between two ranks never waits for a rank
// that makes none (as a send on NCCL, which makes a communicator for the
// pair), and a receive from any source meets whichever rank sends.
// Forming it only at a first device call would spare groups that carry
// only CPU tensors, but then such a pair would wait for every rank, or, if
// pairs formed groups of their own as NCCL's do, a receive from any source
// could not see their sends (docs/design.md, "The private host group").
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace c10d_smddp {

class FormationCancel;
class ProcessGroupSmddp;

class HostGroupFormation {
 public:
  // Forms the group, stopping with kAborted once `cancel` is cancelled.
  using Form =
      std::function<c10::intrusive_ptr<ProcessGroupSmddp>(std::shared_ptr<FormationCancel> cancel)>;

  HostGroupFormation(std::string name, int size, std::chrono::milliseconds timeout, Form form);
  ~HostGroupFormation();
  HostGroupFormation(const HostGroupFormation&) = delete;
  HostGroupFormation& operator=(const HostGroupFormation&) = delete;

  int size() const { return size_; }
  // Starts the formation, once; later calls (and calls after shutdown) do
  // nothing.
  void start();
  // The formed group. Waits for the formation, at most the group timeout,
  // running `check` (which may throw) every few ms meanwhile; throws
  // smddp::Error naming the group when it failed, was shut down, or was
  // never started.
  c10::intrusive_ptr<ProcessGroupSmddp> get(const std::function<void()>& check = {});
  // Why it failed to form, unless a shutdown stopped it; else nothing.
  std::optional<std::string> failure() const;
  // The group once formed (also after a shutdown), else null. Never waits.
  c10::intrusive_ptr<ProcessGroupSmddp> formed() const;
  // "not started", "forming", "formed", "failed" or "shut down"
  // (stats()["device_host_group"]).
  std::string state() const;
  // Cancels a formation in flight, waits for its thread (bounded: the
  // bootstrap checks the cancel every few ms), then shuts the group down.
  void shutdown();

 private:
  enum class State { kIdle, kForming, kFormed, kFailed, kShut };
  void run();
  // Throws why get() has no group; mu_ held.
  [[noreturn]] void fail() const;
  // "smddp: the device path's host group '<name>' " + what.
  std::string described(const std::string& what) const;

  const std::string name_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const Form form_;
  const std::shared_ptr<FormationCancel> cancel_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kIdle;                  // guarded by mu_
  c10::intrusive_ptr<ProcessGroupSmddp> group_;  // guarded by mu_
  std::string error_;                           // guarded by mu_: why it failed
  std::thread thread_;
};

}  // namespace c10d_smddp
