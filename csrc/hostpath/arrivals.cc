#include "hostpath/arrivals.h"

#include <algorithm>
#include <climits>

namespace smddp {

void stampArrivals(ArrivalBoard& board, int me, uint64_t from, uint64_t next, int64_t nowNs) {
  RankArrivals& mine = board.ranks[me];
  for (uint64_t s = std::max(from, next > kArrivalRing ? next - kArrivalRing : 0); s < next; ++s) {
    ArrivalStamp& st = mine.ring[s % kArrivalRing];
    st.seq.store(0, std::memory_order_relaxed);  // a reader mid-way sees a torn slot, not a wrong one
    st.ns.store(nowNs, std::memory_order_release);
    st.seq.store(s + 1, std::memory_order_release);
  }
}

namespace {

// Rank p's stamp of `seq`, or false where its ring has moved on (p issued
// kArrivalRing more since: it was early) or is being rewritten.
bool stampOf(const ArrivalBoard& board, int p, uint64_t seq, int64_t* ns) {
  const ArrivalStamp& st = board.ranks[p].ring[seq % kArrivalRing];
  if (st.seq.load(std::memory_order_acquire) != seq + 1) return false;
  *ns = st.ns.load(std::memory_order_acquire);
  return st.seq.load(std::memory_order_acquire) == seq + 1;
}

}  // namespace

int attributeArrivals(ArrivalBoard& board, int ranks, uint64_t from, uint64_t next,
                      const std::function<uint64_t(int)>& issuedOf) {
  uint64_t everyone = UINT64_MAX;
  for (int p = 0; p < ranks; ++p) everyone = std::min(everyone, issuedOf(p));
  int boundaries = 0;
  for (uint64_t s = from; s < std::min(next, everyone); ++s) {
    Attribution& a = board.window[s % kStragglerWindow];
    uint64_t c = a.claimed.load();
    bool mine = false;
    while (c < s + 1) {
      if (a.claimed.compare_exchange_weak(c, s + 1)) {
        mine = true;
        break;
      }
    }
    if (!mine) continue;  // attributed by a rank that published at the same time
    int last = -1;
    int64_t latest = INT64_MIN;
    int64_t before = INT64_MIN;  // the stamp before the latest
    for (int p = 0; p < ranks; ++p) {
      int64_t ns;
      if (!stampOf(board, p, s, &ns)) continue;
      if (ns >= latest) {
        before = latest;
        latest = ns;
        last = p;
      } else if (ns > before) {
        before = ns;
      }
    }
    a.seq.store(0, std::memory_order_relaxed);
    a.rank.store(last, std::memory_order_relaxed);
    a.waitNs.store(before == INT64_MIN ? 0 : latest - before, std::memory_order_relaxed);
    a.seq.store(s + 1, std::memory_order_release);
    if ((s + 1) % kStragglerWindow == 0) ++boundaries;
  }
  return boundaries;
}

Stragglers readStragglers(const ArrivalBoard& board, int ranks) {
  Stragglers out;
  out.window = kStragglerWindow;
  out.rows.resize(ranks);
  for (int p = 0; p < ranks; ++p) out.rows[p].rank = p;
  uint64_t newest = 0;
  for (const Attribution& a : board.window) newest = std::max(newest, a.seq.load());
  for (const Attribution& a : board.window) {
    const uint64_t seq = a.seq.load(std::memory_order_acquire);
    if (seq == 0 || seq + kStragglerWindow <= newest) continue;  // empty, or older than the window
    const int rank = a.rank.load(std::memory_order_relaxed);
    const int64_t wait = a.waitNs.load(std::memory_order_relaxed);
    if (a.seq.load(std::memory_order_acquire) != seq || rank < 0 || rank >= ranks) continue;
    ++out.calls;
    out.rows[rank].last++;
    out.rows[rank].causedNs += wait;
  }
  return out;
}

}  // namespace smddp
