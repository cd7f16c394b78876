#include "observe/desync.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/thread_name.h"

namespace smddp {

namespace {
constexpr const char* kBye = "bye";
}

struct DesyncResponder::Shared {
  std::unique_ptr<Bootstrap> waitStore;  // the answering thread's alone
  std::unique_ptr<Bootstrap> askStore;   // one asking thread at a time (askMu)
  std::string prefix;
  std::shared_ptr<FlightRecorder> recorder;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  bool answererExited = false;  // guarded by mu
  bool byeDone = false;         // guarded by mu
  std::mutex askMu;             // serialises users of askStore

  std::string reqKey(int r) const { return prefix + "desync/req/" + std::to_string(r); }
  std::string posKey(int r) const { return prefix + "desync/pos/" + std::to_string(r); }
  // Set once this rank's answering thread no longer waits in the store.
  std::string stoppedKey(int r) const { return prefix + "desync/stopped/" + std::to_string(r); }

  // The answering thread: blocked on this rank's request key until a peer
  // asks (then it answers once: a group that failed this way is unusable,
  // so nobody asks again) or the group goes away.
  void answer() {
    const int me = recorder->rank();
    bool storeFailed = false;
    while (!stop.load()) {
      try {
        // A store that blocks on the key gets long waits (a TCPStore logs a
        // warning each time one runs out; shutdown wakes this thread with
        // kBye anyway); a polled one is polled in short waits, so that the
        // thread sees `stop` even if kBye never lands.
        const auto chunk = waitStore->waitBlocks() ? std::chrono::milliseconds(86400000)
                                                   : std::chrono::milliseconds(1000);
        if (!waitStore->waitFor(reqKey(me), chunk)) continue;
        std::string why;
        waitStore->tryGet(reqKey(me), &why);
        if (stop.load() || why == kBye) break;
        const std::string mine = recorder->position().serialize();
        recorder->notePosition(mine);
        waitStore->set(posKey(me), mine);
        dumpFlightRecord(*recorder, "rank asked for a desync report: " + why);
      } catch (const std::exception& e) {
        storeFailed = true;
        SMDDP_LOG(kDebug) << "group '" << recorder->group() << "' rank " << me
                          << ": desync responder stops: " << e.what();
      }
      break;
    }
    // Out of the store for good (rank 0 waits for this at an orderly
    // shutdown: awaitPeersStopped), whether it said goodbye or answered.
    if (!storeFailed) {
      try {
        waitStore->set(stoppedKey(me), "1");
      } catch (const std::exception&) {
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    answererExited = true;
    cv.notify_all();
  }
};

DesyncResponder::DesyncResponder(std::unique_ptr<Bootstrap> waitStore,
                                 std::unique_ptr<Bootstrap> askStore, std::string prefix,
                                 std::shared_ptr<FlightRecorder> recorder)
    : shared_(std::make_shared<Shared>()) {
  shared_->waitStore = std::move(waitStore);
  shared_->askStore = std::move(askStore);
  shared_->prefix = std::move(prefix);
  shared_->recorder = std::move(recorder);
  answerer_ = std::thread([s = shared_] {
    smddp::nameThisThread("smddp-desync");
    s->answer();
  });
}

namespace {

// Joins `t` if `finished`, else leaves it running on its own.
void joinOrLeave(std::thread& t, bool finished) {
  if (!t.joinable()) return;
  if (finished) t.join();
  else t.detach();
}

}  // namespace

DesyncResponder::~DesyncResponder() {
  auto s = shared_;
  s->stop.store(true);
  // Wake the answering thread through the other connection; a store that
  // hangs holds only these threads, left behind, never the caller.
  std::thread bye([s] {
    smddp::nameThisThread("smddp-dsync-bye");
    {
      std::lock_guard<std::mutex> ask(s->askMu);
      try {
        s->askStore->set(s->reqKey(s->recorder->rank()), kBye);
      } catch (const std::exception&) {
      }
    }
    std::lock_guard<std::mutex> lock(s->mu);
    s->byeDone = true;
    s->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait_for(lock, std::chrono::milliseconds(200),
                 [&] { return s->answererExited && s->byeDone; });
  const bool answered = s->answererExited, said = s->byeDone;
  lock.unlock();
  joinOrLeave(answerer_, answered);
  joinOrLeave(bye, said);
}

void DesyncResponder::awaitPeersStopped(std::chrono::milliseconds bound,
                                         const std::function<bool(int)>& lost) {
  using clock = std::chrono::steady_clock;
  auto s = shared_;
  const int me = s->recorder->rank();
  const auto until = clock::now() + bound;
  // Polled, not waited on: a TCPStore wait that runs out logs a warning.
  // A peer found lost meanwhile is not waited for.
  PollPause pause(std::chrono::milliseconds(5));
  std::lock_guard<std::mutex> ask(s->askMu);
  try {
    std::string value;
    for (int r = 0; r < s->recorder->size(); ++r) {
      while (r != me && !lost(r) && !s->askStore->tryGet(s->stoppedKey(r), &value)) {
        if (clock::now() >= until) return;
        std::this_thread::sleep_for(pause.next());
      }
    }
  } catch (const std::exception& e) {  // the store is gone: nobody waits in it
    SMDDP_LOG(kDebug) << "group '" << s->recorder->group() << "' rank " << me
                      << ": not waiting for the peers' desync threads: " << e.what();
  }
}

std::string DesyncResponder::collect(std::chrono::milliseconds budget,
                                     const std::function<bool(int)>& lost,
                                     const std::string& reason) {
  auto s = shared_;
  const int me = s->recorder->rank();
  const int n = s->recorder->size();
  struct Job {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> answers;  // guarded by mu; "" = none yet
    bool done = false;                 // guarded by mu
  };
  auto job = std::make_shared<Job>();
  job->answers.resize(n);
  std::vector<bool> ask(n, false);
  for (int r = 0; r < n; ++r) ask[r] = r != me && !lost(r);
  const auto until = std::chrono::steady_clock::now() + budget;
  const std::string mine = s->recorder->position().serialize();
  s->recorder->notePosition(mine);
  std::thread asker([s, job, ask, until, mine, me, n, reason] {
    smddp::nameThisThread("smddp-dsync-ask");
    try {
      std::lock_guard<std::mutex> askLock(s->askMu);
      s->askStore->set(s->posKey(me), mine);
      for (int r = 0; r < n; ++r) {
        if (ask[r]) s->askStore->set(s->reqKey(r), reason.substr(0, 200));
      }
      int missing = 0;
      do {
        missing = 0;
        for (int r = 0; r < n; ++r) {
          if (!ask[r]) continue;
          {
            std::lock_guard<std::mutex> lock(job->mu);
            if (!job->answers[r].empty()) continue;
          }
          std::string v;
          if (s->askStore->tryGet(s->posKey(r), &v) && !v.empty()) {
            std::lock_guard<std::mutex> lock(job->mu);
            job->answers[r] = v;
          } else {
            ++missing;
          }
        }
        if (missing) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } while (missing && std::chrono::steady_clock::now() < until);
    } catch (const std::exception& e) {
      SMDDP_LOG(kWarn) << "group '" << s->recorder->group() << "' rank " << me
                       << ": the desync report's store calls failed: " << e.what();
    }
    std::lock_guard<std::mutex> lock(job->mu);
    job->done = true;
    job->cv.notify_all();
  });

  std::vector<RankPosition> positions;
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait_until(lock, until + std::chrono::milliseconds(50), [&] { return job->done; });
    joinOrLeave(asker, job->done);  // done: it has only to return
    for (int r = 0; r < n; ++r) {
      RankPosition p;
      if (r == me) {
        p = RankPosition::parse(r, mine);
      } else if (!ask[r]) {
        p.rank = r;
        p.kind = RankPosition::Kind::kLost;
      } else if (!job->answers[r].empty()) {
        p = RankPosition::parse(r, job->answers[r]);
      } else {
        p.rank = r;
        p.kind = RankPosition::Kind::kUnreachable;
      }
      positions.push_back(p);
    }
  }
  return formatDesyncReport(std::move(positions));
}

}  // namespace smddp
