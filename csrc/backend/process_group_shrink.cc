// dist.shrink_group (torch 2.13): the survivors of a failure build a
// smaller group from this one and go on, their processes, state and
// memory kept. The new group forms among the survivors alone, through
// this group's store under a prefix every survivor derives the same way
// (no new rendezvous through torchrun); its host topology, host segments
// and servers are formed afresh for the survivors, as any group's are.
#include <algorithm>
#include <set>
#include <sstream>

#include "backend/process_group.h"
#include "common/error.h"

namespace c10d_smddp {

namespace {

// torch.distributed.distributed_c10d.SHRINK_DEFAULT / SHRINK_ABORT.
constexpr int kShrinkAbort = 0x01;

std::string joined(const std::vector<int64_t>& ranks) {
  std::ostringstream o;
  for (size_t i = 0; i < ranks.size(); ++i) o << (i ? "," : "") << ranks[i];
  return o.str();
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> ProcessGroupSmddp::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>& /*optsOverride: torch_smddp.Options go through shrinkTo*/) {
  return shrinkTo(ranksToExclude, shrinkFlags, std::nullopt);
}

c10::intrusive_ptr<ProcessGroupSmddp> ProcessGroupSmddp::shrinkTo(
    std::vector<int64_t> excluded, int shrinkFlags, std::optional<std::string> crossHostDtype) {
  std::sort(excluded.begin(), excluded.end());
  const std::set<int64_t> unique(excluded.begin(), excluded.end());
  TORCH_CHECK_VALUE(!excluded.empty(), "smddp shrink: no rank to exclude");
  TORCH_CHECK_VALUE(unique.size() == excluded.size(), "smddp shrink: rank(s) ", joined(excluded),
                    " name a rank twice");
  TORCH_CHECK_VALUE(excluded.front() >= 0 && excluded.back() < size_, "smddp shrink: rank(s) ",
                    joined(excluded), " are not all ranks of a group of ", size_);
  TORCH_CHECK_VALUE(static_cast<int>(excluded.size()) < size_,
                    "smddp shrink: excluding every rank leaves no group");
  TORCH_CHECK(!unique.count(rank_), "smddp shrink: rank ", rank_,
              " is among the ranks to exclude (", joined(excluded),
              "); only the ranks that remain call shrink_group");
  TORCH_CHECK_VALUE(shrinkFlags == 0 || shrinkFlags == kShrinkAbort, "smddp shrink: flags ",
                    shrinkFlags, " are neither SHRINK_DEFAULT (0) nor SHRINK_ABORT (1)");
  const std::string leaving = "rank(s) " + joined(excluded);
  if (shrinkFlags == kShrinkAbort) {
    // Calls in flight (one may wait on an excluded rank) fail now; the
    // group's error says why.
    asyncError_->record(smddp::ErrorKind::kAborted,
                        "smddp: the group was shrunk to exclude " + leaving +
                            " (SHRINK_ABORT): its calls in flight were aborted");
    shutdown();
  } else if (comm_) {
    const size_t open = comm_->unfinishedCalls();
    TORCH_CHECK(open == 0, "smddp shrink: SHRINK_DEFAULT needs the group idle, but ", open,
                " call(s) are unfinished; wait for them, or shrink with SHRINK_ABORT, which "
                "aborts them");
  }
  const int newRank =
      rank_ - static_cast<int>(std::count_if(excluded.begin(), excluded.end(),
                                             [&](int64_t r) { return r < rank_; }));
  const int newSize = size_ - static_cast<int>(excluded.size());
  // Every survivor of this group instance derives the same prefix; a
  // second shrink of the same group (other ranks lost) gets its own.
  const int generation = shrinks_++;
  const std::string prefix = "shrink/" + (comm_ ? comm_->storePrefix() : std::string()) +
                             std::to_string(generation) + "/" + joined(excluded);
  GroupOptions options;
  options.servers = servers_;
  options.crossHostDtype = crossHostDtype ? *crossHostDtype : crossHostDtype_;
  return c10::make_intrusive<ProcessGroupSmddp>(
      c10::make_intrusive<c10d::PrefixStore>(prefix, store_), newRank, newSize, timeout_,
      groupName_ + "/shrunk" + std::to_string(generation), std::move(options));
}

}  // namespace c10d_smddp
