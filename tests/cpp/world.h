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

#include <chrono>
#include <exception>
#include <future>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/collective_calls.h"
#include "engine/communicator.h"
#include "hostpath/allreduce_paths.h"
#include "transport/bootstrap.h"
#include "fork_children.h"

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

// A barrier on `comm`, waited for: "" or the error's text.
inline std::string barrierSync(Communicator& comm) {
  std::promise<std::exception_ptr> p;
  barrier(comm, [&](std::exception_ptr e) { p.set_value(e); });
  auto e = p.get_future().get();
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

inline std::vector<std::string> runWorld(
    int size, const std::function<std::string(Communicator&)>& fn,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
    std::chrono::seconds hardDeadline = std::chrono::seconds(60),
    const std::function<void(int rank)>& beforeInit = nullptr) {
  return runChildren(
      size,
      [&](int r, const std::string& dir) {
        if (beforeInit) beforeInit(r);  // e.g. per-rank SMDDP_HOST_ID
        FileBootstrap boot(dir);
        CommOptions opts;
        opts.rank = r;
        opts.size = size;
        opts.timeout = timeout;
        opts.name = "test";
        Communicator comm(boot, opts, standardEngineParts());
        return fn(comm);
      },
      hardDeadline);
}

}  // namespace smddp::test
