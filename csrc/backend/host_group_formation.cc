#include "backend/host_group_formation.h"

#include "backend/process_group.h"
#include "backend/store_bootstrap.h"
#include "common/error.h"
#include "common/thread_name.h"

namespace c10d_smddp {

HostGroupFormation::HostGroupFormation(std::string name, int size, std::chrono::milliseconds timeout,
                             Form form)
    : name_(std::move(name)),
      size_(size),
      timeout_(timeout),
      form_(std::move(form)),
      cancel_(std::make_shared<FormationCancel>()) {}

HostGroupFormation::~HostGroupFormation() { shutdown(); }

void HostGroupFormation::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kIdle) return;
  state_ = State::kForming;
  thread_ = std::thread([this] {
    smddp::nameThisThread("smddp-hostgroup");
    run();
  });
}

void HostGroupFormation::run() {
  c10::intrusive_ptr<ProcessGroupSmddp> group;
  std::string error;
  try {
    group = form_(cancel_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (group) {
    group_ = std::move(group);
    state_ = State::kFormed;
  } else {
    error_ = std::move(error);
    state_ = State::kFailed;
  }
  cv_.notify_all();
}

c10::intrusive_ptr<ProcessGroupSmddp> HostGroupFormation::get(const std::function<void()>& check) {
  const auto until = std::chrono::steady_clock::now() + timeout_;
  std::unique_lock<std::mutex> lock(mu_);
  while (state_ == State::kForming && std::chrono::steady_clock::now() < until) {
    cv_.wait_for(lock, std::chrono::milliseconds(5), [&] { return state_ != State::kForming; });
    if (state_ != State::kForming || !check) continue;
    lock.unlock();
    check();
    lock.lock();
  }
  if (state_ != State::kFormed) fail();
  return group_;
}

std::string HostGroupFormation::described(const std::string& what) const {
  return "smddp: the device path's host group '" + name_ + "' " + what;
}

std::optional<std::string> HostGroupFormation::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kFailed || cancel_->cancelled()) return std::nullopt;
  return described("did not form: " + error_);
}

void HostGroupFormation::fail() const {
  switch (state_) {
    case State::kForming:
      smddp::throwError(smddp::ErrorKind::kTimeout,
                        described("did not form within " + std::to_string(timeout_.count()) +
                                  " ms of this call; it began when the group formed, on every rank."));
    case State::kFailed:
      smddp::throwError(cancel_->cancelled() ? smddp::ErrorKind::kAborted : smddp::ErrorKind::kTimeout,
                        described("did not form: " + error_));
    case State::kShut:
      smddp::throwError(smddp::ErrorKind::kAborted, described("was shut down"));
    default:
      smddp::throwError(smddp::ErrorKind::kInternal, described("was never started"));
  }
}

c10::intrusive_ptr<ProcessGroupSmddp> HostGroupFormation::formed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return group_;  // set only once formed; kept after a shutdown, for its error
}

std::string HostGroupFormation::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  switch (state_) {
    case State::kIdle: return "not started";
    case State::kForming: return "forming";
    case State::kFormed: return "formed";
    case State::kFailed: return "failed";
    case State::kShut: return "shut down";
  }
  return "";
}

void HostGroupFormation::shutdown() {
  cancel_->cancel();
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    thread.swap(thread_);
  }
  if (thread.joinable()) thread.join();
  c10::intrusive_ptr<ProcessGroupSmddp> group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    group = group_;
    if (state_ != State::kFailed) state_ = State::kShut;
    cv_.notify_all();
  }
  if (group) group->shutdown();
}

}  // namespace c10d_smddp
