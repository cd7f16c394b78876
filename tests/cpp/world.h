// Runs one function per rank, each rank a forked process with its own
// Communicator, meeting through a FileBootstrap in a fresh directory (the
// way torchrun places ranks). Each rank returns a string ("" = fine) that
// the parent collects; a rank that hangs past the hard deadline is killed
// and reported, so a hang fails the test instead of the suite.
//
// Forked processes rather than threads: libfabric's shm provider maps a
// peer's region per process, and several endpoints tearing down inside one
// address space is not a configuration it supports.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/communicator.h"
#include "hostpath/allreduce_paths.h"
#include "transport/bootstrap.h"

namespace smddp::test {

// Allreduce runs through the host's shared-memory segment.
inline bool usesHostPath(const Communicator& comm) {
  return comm.allreducePath().throughHostSegment();
}
// Allreduce runs over libfabric only and fuses queued calls there.
inline bool fusesOnNetwork(const Communicator& comm) {
  return comm.allreducePath().fuses() && !usesHostPath(comm);
}

// Sets an environment variable for the lifetime of the object (children
// inherit it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old, hadOld_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (hadOld_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool hadOld_ = false;
};

inline std::vector<std::string> runWorld(
    int size, const std::function<std::string(Communicator&)>& fn,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
    std::chrono::seconds hardDeadline = std::chrono::seconds(60),
    const std::function<void(int rank)>& beforeInit = nullptr) {
  char tmpl[] = "/tmp/smddp-world-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      std::string result;
      try {
        if (beforeInit) beforeInit(r);  // e.g. per-rank SMDDP_HOST_ID
        FileBootstrap boot(dir);
        CommOptions opts;
        opts.rank = r;
        opts.size = size;
        opts.timeout = timeout;
        opts.name = "test";
        Communicator comm(boot, opts, standardEngineParts());
        result = fn(comm);
      } catch (const std::exception& e) {
        result = std::string("rank threw: ") + e.what();
      }
      std::ofstream(dir + "/result." + std::to_string(r)) << result;
      _exit(0);
    }
    pids.push_back(pid);
  }
  auto deadline = std::chrono::steady_clock::now() + hardDeadline;
  std::vector<std::string> out(size);
  std::vector<bool> done(size, false);
  int remaining = size;
  while (remaining > 0) {
    for (int r = 0; r < size; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        std::ifstream f(dir + "/result." + std::to_string(r));
        std::stringstream ss;
        ss << f.rdbuf();
        out[r] = f.good() ? ss.str()
                          : "rank " + std::to_string(r) + " died (status " +
                                std::to_string(status) + ")";
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < size; ++r) {
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          out[r] = "rank " + std::to_string(r) + " hung and was killed";
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string cmd = "rm -rf '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) {
  }
  return out;
}

}  // namespace smddp::test
