// Compression between hosts (SMDDP_CROSS_HOST_DTYPE, reduce/narrow_wire.h,
// docs/design.md, "Compression between hosts").
//
// Oracles: the wire form against the independent conversions of
// reduce_reference.h and an f64 error bound; the allreduce across pretend
// hosts against an f64 sum of the same inputs, within the bound the design
// states, on adversarial inputs (cancellation between hosts, magnitudes
// from 2^-100 to past f16's range, ordinary values in one piece). The bound
// must be reached in part (max error / bound above 5%), so a path that did
// not compress, or a bound too loose to mean anything, fails.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "engine/communicator.h"
#include "hostpath/allreduce_paths.h"
#include "reduce/narrow_wire.h"
#include "reduce_reference.h"
#include "world.h"

using namespace smddp;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;
using smddp::test::usesHostPath;
using namespace reduce_ref;

namespace {


// Element j of rank r on host `host`: classes by j % 5 (see the header).
float adversarial(int r, int host, size_t j) {
  const uint64_t h = mix((static_cast<uint64_t>(r) << 40) ^ j);
  const uint64_t g = mix(j * 7919 + 1);  // shared by every rank
  const double sign = (h & 1) ? 1.0 : -1.0;
  switch (j % 5) {
    case 0: {  // one large value, + on even hosts and - on odd: the hosts cancel
      const double big = std::ldexp(1.0, static_cast<int>(g % 61) - 30);
      return static_cast<float>((host % 2 ? -big : big) * (1.0 + 0.001 * unit(g >> 3)) +
                                1e-3 * big * (unit(h) - 0.5));
    }
    case 1: return static_cast<float>(sign * std::ldexp(1.0 + unit(h), static_cast<int>(h % 121) - 60));
    case 2: return static_cast<float>(sign * (1e4 + 1e6 * unit(h)));  // past f16's 65504 when summed
    case 3: return static_cast<float>(sign * std::ldexp(1.0 + unit(h), -100 + static_cast<int>(h % 20)));
    default: return static_cast<float>(2.0 * unit(h) - 1.0);
  }
}

double unitRoundoff(DataType wire) { return wire == DataType::kFloat16 ? 0x1.0p-11 : 0x1.0p-8; }

// The scale the header's rule gives, computed here independently.
float expectedScale(const std::vector<float>& x, DataType wire) {
  double m = 0;
  for (float v : x) {
    if (std::isfinite(v)) m = std::max(m, std::fabs(static_cast<double>(v)));
  }
  if (m == 0) return 1.0f;
  int e = 0;
  std::frexp(m, &e);  // 2^(e-1) <= m < 2^e
  int se = wire == DataType::kFloat16 ? 15 - e : std::min(0, 127 - e);
  se = std::max(-126, std::min(127, se));
  return std::ldexp(1.0f, se);
}

float referenceRoundTrip(float x, float scale, DataType wire) {
  const float scaled = x * scale;
  const float back = wire == DataType::kFloat16 ? refHalfToFloat(refFloatToHalf(scaled))
                                                : refBf16ToFloat(refFloatToBf16(scaled));
  const float v = back / scale;
  // The header's rule: a finite value that rounds past f32's largest reads
  // back as the largest.
  if (std::isinf(v) && !std::isinf(back)) return std::copysign(std::numeric_limits<float>::max(), v);
  return v;
}

std::string roundTripCase(const std::vector<float>& x, DataType wire) {
  std::vector<unsigned char> packed(narrowWireBytes(x.size(), wire));
  std::vector<float> scratch(x.size()), back(x.size(), -7.0f);
  packNarrowWire(packed.data(), x.data(), x.size(), wire, scratch.data());
  if (!unpackNarrowWire(back.data(), packed.data(), x.size(), wire)) return "unpack refused its own piece";
  const float scale = expectedScale(x, wire);
  float sent;
  std::memcpy(&sent, packed.data(), sizeof(float));
  if (sent != scale) return "scale " + std::to_string(sent) + ", expected " + std::to_string(scale);
  double m = 0;
  for (float v : x) if (std::isfinite(v)) m = std::max(m, std::fabs(static_cast<double>(v)));
  const double u = unitRoundoff(wire);
  const double floorTerm = wire == DataType::kFloat16 ? 0x1.0p-39 * m : 0x1.0p-134;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = referenceRoundTrip(x[i], scale, wire);
    const bool same = std::memcmp(&want, &back[i], sizeof(float)) == 0 ||
                      (std::isnan(want) && std::isnan(back[i]));
    if (!same) {
      return "element " + std::to_string(i) + " (" + std::to_string(x[i]) + ") read back as " +
             std::to_string(back[i]) + ", the reference gives " + std::to_string(want);
    }
    if (!std::isfinite(x[i])) continue;
    if (!std::isfinite(back[i])) return "finite " + std::to_string(x[i]) + " overflowed";
    const double err = std::fabs(static_cast<double>(back[i]) - x[i]);
    if (err > u * std::fabs(static_cast<double>(x[i])) + floorTerm) {
      return "element " + std::to_string(i) + ": error " + std::to_string(err) +
             " exceeds the stated bound";
    }
  }
  return "";
}

}  // namespace

TEST_CASE("the narrow wire form rounds once, scales by a power of two and never overflows",
          "[cross_host][reduce]") {
  const DataType wire = GENERATE(DataType::kBFloat16, DataType::kFloat16);
  INFO(toString(wire));
  std::vector<std::vector<float>> cases;
  std::vector<float> mixed(4099);
  for (size_t j = 0; j < mixed.size(); ++j) mixed[j] = adversarial(static_cast<int>(j % 3), 0, j);
  cases.push_back(mixed);
  cases.push_back({1e5f, -3e7f, 65504.0f, 65520.0f, 1e30f, -1e-30f});  // past f16's range
  cases.push_back({3e-20f, -1e-21f, 7e-22f, 1e-25f});                    // far below it
  cases.push_back({std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 1.0f});
  cases.push_back({0.0f, -0.0f, 0.0f});
  cases.push_back({});
  const float inf = std::numeric_limits<float>::infinity();
  cases.push_back({inf, -inf, std::nanf(""), 2.5f, -1e6f});
  for (size_t c = 0; c < cases.size(); ++c) {
    INFO("case " << c);
    CHECK(roundTripCase(cases[c], wire) == "");
  }
}

TEST_CASE("a piece whose scale is not a power of two is refused", "[cross_host][reduce]") {
  const DataType wire = GENERATE(DataType::kBFloat16, DataType::kFloat16);
  std::vector<float> x = {1.0f, 2.0f};
  std::vector<unsigned char> packed(narrowWireBytes(x.size(), wire));
  std::vector<float> scratch(2), back(2, 5.0f);
  packNarrowWire(packed.data(), x.data(), x.size(), wire, scratch.data());
  for (float bad : {3.0f, 0.0f, -1.0f, std::nanf(""), std::numeric_limits<float>::infinity(),
                    0x1.0p-127f}) {
    std::memcpy(packed.data(), &bad, sizeof(float));
    CHECK_FALSE(unpackNarrowWire(back.data(), packed.data(), x.size(), wire));
    CHECK(back[0] == 5.0f);  // nothing written
  }
}

TEST_CASE("reducing wire pieces gives the bits of unpacking each and reducing the floats",
          "[cross_host][reduce]") {
  // The oracle: unpackNarrowWire on each piece, then reduceOrdered over the
  // floats, as the servers did before reduceNarrowWire read the pieces in
  // one pass. bf16 with every scale 1 takes that pass; one piece holding a
  // value past bf16's range (scaled), fp16 (always scaled) and AVG do not.
  // Both kernel sets (AVX2 where there is one, and scalar).
  const DataType wire = GENERATE(DataType::kBFloat16, DataType::kFloat16);
  const ReduceOp op = GENERATE(ReduceOp::kSum, ReduceOp::kAvg);
  const bool huge = GENERATE(false, true);
  const bool scalar = GENERATE(false, true);
  const bool wasScalar = setForceScalarKernels(scalar);
  const size_t n = 5, count = 3001;  // past a tile, and odd
  std::vector<std::vector<unsigned char>> packed(n);
  std::vector<const void*> pieces(n);
  std::vector<float> scratch(count);
  for (size_t p = 0; p < n; ++p) {
    std::vector<float> x(count);
    for (size_t j = 0; j < count; ++j) {
      x[j] = adversarial(static_cast<int>(p), static_cast<int>(p), j);
    }
    if (huge && p == 2) x[7] = 3e38f;
    x[11] = p == 1 ? std::numeric_limits<float>::infinity() : x[11];
    packed[p].resize(narrowWireBytes(count, wire));
    packNarrowWire(packed[p].data(), x.data(), count, wire, scratch.data());
    pieces[p] = packed[p].data();
  }
  std::vector<float> wide(n * count), want(count), got(count, -7.0f);
  std::vector<const void*> floats(n);
  for (size_t p = 0; p < n; ++p) {
    REQUIRE(unpackNarrowWire(wide.data() + p * count, pieces[p], count, wire));
    floats[p] = wide.data() + p * count;
  }
  reduceOrdered(want.data(), floats.data(), n, count, DataType::kFloat32, op, double(n));
  std::vector<float> work(n * count);
  CHECK(reduceNarrowWire(got.data(), pieces.data(), n, count, wire, op, double(n), work.data()) ==
        -1);
  size_t differ = 0;
  for (size_t j = 0; j < count; ++j) {
    uint32_t a, b;
    std::memcpy(&a, &want[j], 4);
    std::memcpy(&b, &got[j], 4);
    differ += a != b && !(std::isnan(want[j]) && std::isnan(got[j]));
  }
  INFO(toString(wire) << (op == ReduceOp::kSum ? " SUM" : " AVG") << (huge ? ", scaled" : "")
                      << (scalar ? ", scalar" : ""));
  CHECK(differ == 0);
  // A piece with a broken scale is named by its index.
  float bad = 3.0f;
  std::memcpy(packed[3].data(), &bad, sizeof(float));
  CHECK(reduceNarrowWire(got.data(), pieces.data(), n, count, wire, op, double(n), work.data()) ==
        3);
  setForceScalarKernels(wasScalar);
}

TEST_CASE("SMDDP_CROSS_HOST_DTYPE names itself when it holds no dtype", "[cross_host][param]") {
  ScopedEnv env("SMDDP_CROSS_HOST_DTYPE", "fp8");
  try {
    (void)readEngineConfig();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("SMDDP_CROSS_HOST_DTYPE='fp8' is not a cross-host dtype") !=
          std::string::npos);
  }
  ScopedEnv ok("SMDDP_CROSS_HOST_DTYPE", "BFloat16");
  CHECK(readEngineConfig().crossHostDtype == DataType::kBFloat16);
}

namespace {

struct Layout {
  int hosts, perHost;
};

// One rank's job: f32 SUM and AVG of the adversarial inputs, twice each;
// returns "" or what failed, then " hash" of its results (compared across
// ranks by the test).
std::string compressedJob(Communicator& comm, Layout layout, DataType wire) {
  const size_t N = 300007;  // several pipeline steps of every shard
  const int n = comm.size();
  const int L = layout.perHost, H = layout.hosts;
  // One rank per host takes the network-only path, which compresses every
  // f32 sum there; otherwise the hierarchy compresses only what crosses.
  if (usesHostPath(comm) != (L > 1)) {
    return L > 1 ? "the group did not take the shared-memory path"
                 : "one rank per host took the shared-memory path";
  }
  uint64_t hash = 1469598103934665603ull;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      std::vector<float> v(N);
      for (size_t j = 0; j < N; ++j) v[j] = adversarial(comm.rank(), comm.rank() / L, j);
      comm.allreduceSync({{v.data(), N}}, DataType::kFloat32, op);
      if (run == 0) {
        first = v;
        continue;
      }
      if (std::memcmp(first.data(), v.data(), N * sizeof(float)) != 0) {
        size_t diff = 0, at = N;
        for (size_t j = 0; j < N; ++j) {
          if (std::memcmp(&first[j], &v[j], sizeof(float)) != 0 && diff++ == 0) at = j;
        }
        return std::string("the same inputs gave different bytes on a second run (") +
               toString(op) + ": " + std::to_string(diff) + " elements, the first " +
               std::to_string(at) + ": " + std::to_string(first[at]) + " then " +
               std::to_string(v[at]) + ")";
      }
    }
    // The f64 oracle and the bound (docs/design.md, "Compression between hosts").
    const double u = unitRoundoff(wire);
    std::vector<double> exact(N), partialsAbs(N), inputsAbs(N);
    std::vector<double> maxPartial(H, 0.0);
    double maxExact = 0;
    for (size_t j = 0; j < N; ++j) {
      for (int h = 0; h < H; ++h) {
        double p = 0;
        for (int l = 0; l < L; ++l) {
          const double x = adversarial(h * L + l, h, j);
          p += x;
          inputsAbs[j] += std::fabs(x);
        }
        exact[j] += p;
        partialsAbs[j] += std::fabs(p);
        maxPartial[h] = std::max(maxPartial[h], std::fabs(p));
      }
      maxExact = std::max(maxExact, std::fabs(exact[j]));
    }
    double floorTerm = 0;
    if (wire == DataType::kFloat16) {
      for (double m : maxPartial) floorTerm += 0x1.0p-39 * m;
      floorTerm += 0x1.0p-39 * maxExact;
    }
    double worst = 0;
    for (size_t j = 0; j < N; ++j) {
      double bound = 1.01 * u * (partialsAbs[j] + std::fabs(exact[j])) +
                     (L + H + 2) * 0x1.0p-24 * inputsAbs[j] + floorTerm;
      double want = exact[j];
      if (op == ReduceOp::kAvg) {
        want /= n;
        bound = bound / n + 0x1.0p-23 * std::fabs(want);
      }
      const double err = std::fabs(static_cast<double>(first[j]) - want);
      if (!(err <= bound)) {
        return std::string(toString(op)) + " element " + std::to_string(j) + " = " +
               std::to_string(first[j]) + ", f64 sum " + std::to_string(want) + ": error " +
               std::to_string(err) + " exceeds the bound " + std::to_string(bound);
      }
      if (bound > 0) worst = std::max(worst, err / bound);
    }
    if (worst < 0.05) {
      return std::string(toString(op)) + ": the largest error is " + std::to_string(worst) +
             " of the bound; the partials did not cross in " + toString(wire);
    }
    for (float f : first) {
      uint32_t b;
      std::memcpy(&b, &f, 4);
      hash = (hash ^ b) * 1099511628211ull;
    }
  }
  // MAX is not compressed: the exact maximum, on either path.
  std::vector<float> v(N);
  for (size_t j = 0; j < N; ++j) v[j] = adversarial(comm.rank(), comm.rank() / L, j);
  comm.allreduceSync({{v.data(), N}}, DataType::kFloat32, ReduceOp::kMax);
  for (size_t j = 0; j < N; ++j) {
    float want = adversarial(0, 0, j);
    for (int r = 1; r < n; ++r) want = std::max(want, adversarial(r, r / L, j));
    if (!(v[j] == want)) {
      return "MAX element " + std::to_string(j) + " = " + std::to_string(v[j]) + ", not " +
             std::to_string(want);
    }
  }
  return " " + std::to_string(hash);
}

void runCompressed(Layout layout, DataType wire) {
  const int n = layout.hosts * layout.perHost;
  const std::string name = wire == DataType::kFloat16 ? "fp16" : "bf16";
  ScopedEnv env("SMDDP_CROSS_HOST_DTYPE", name);
  auto results = runWorld(n, [layout, wire](Communicator& comm) {
    return compressedJob(comm, layout, wire);
  }, std::chrono::milliseconds(30000), std::chrono::seconds(120), [layout](int r) {
    setenv("SMDDP_HOST_ID", ("host" + std::to_string(r / layout.perHost)).c_str(), 1);
  });
  INFO(name << " across " << layout.hosts << " x " << layout.perHost << " pretend hosts");
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << results[r]);
    REQUIRE(results[r].size() > 1);
    CHECK(results[r][0] == ' ');
    CHECK(results[r] == results[0]);  // every rank has the same bytes
  }
}

}  // namespace

TEST_CASE("bf16 and fp16 crossing pretend hosts stay within the stated bound on every rank",
          "[cross_host][hosts]") {
  runCompressed({2, 2}, DataType::kBFloat16);
  runCompressed({2, 2}, DataType::kFloat16);
}

TEST_CASE("one rank per host crosses narrow on the network-only path, within the same bound",
          "[cross_host][hosts]") {
  runCompressed({3, 1}, DataType::kBFloat16);
  runCompressed({3, 1}, DataType::kFloat16);
}

TEST_CASE("ranks that disagree on SMDDP_CROSS_HOST_DTYPE fail to form, naming it",
          "[cross_host][hosts][errors]") {
  // 2 x 2 takes the shared-memory path, 4 x 1 the network-only one.
  const int perHost = GENERATE(2, 1);
  INFO(perHost << " rank(s) per host");
  auto results = runWorld(4, [](Communicator&) { return std::string("formed"); },
                          std::chrono::milliseconds(10000), std::chrono::seconds(60),
                          [perHost](int r) {
    setenv("SMDDP_HOST_ID", ("host" + std::to_string(r / perHost)).c_str(), 1);
    setenv("SMDDP_CROSS_HOST_DTYPE", r == 3 ? "fp32" : "bf16", 1);
  });
  for (const auto& r : results) {
    INFO(r);
    CHECK(r.find("SMDDP_CROSS_HOST_DTYPE") != std::string::npos);
    CHECK(r.find("must be the same on every rank") != std::string::npos);
  }
}

TEST_CASE("queued bf16-crossing calls fuse on the network-only path into the bytes of one at a time",
          "[cross_host][hosts][netfusion]") {
  // bf16's scale is 1 for these values, so every element is rounded the
  // same way whatever chunk it lands in: fused or alone, the bytes must be
  // the same. The calls alone are the oracle (their bound is checked above).
  ScopedEnv env("SMDDP_CROSS_HOST_DTYPE", "bf16");
  auto results = runWorld(3, [](Communicator& comm) -> std::string {
    if (usesHostPath(comm) || !test::fusesOnNetwork(comm)) return "wrong allreduce path";
    const int r = comm.rank();
    auto input = [r](int call, size_t count) {
      std::vector<float> v(count);
      for (size_t j = 0; j < count; ++j) v[j] = adversarial(r, r, j * 131 + call);
      return v;
    };
    // A large call first, so the small ones queue behind it on every rank.
    const int calls = 24;
    std::vector<std::vector<float>> fused(calls + 1);
    fused[0] = input(0, 1 << 20);
    for (int i = 1; i <= calls; ++i) fused[i] = input(i, 1000 + 37 * i);
    std::atomic<int> done{0}, failed{0};
    auto onDone = [&](std::exception_ptr e) {
      if (e) failed++;
      done++;
    };
    const Stats before = comm.stats();
    for (auto& v : fused) {
      comm.allreduce({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum, onDone);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
    while (done.load() < calls + 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (done.load() < calls + 1 || failed.load()) return "queued calls failed or hung";
    const Stats after = comm.stats();
    const uint64_t fusedCalls = after.fusedCalls - before.fusedCalls;
    const uint64_t flushes = after.fusionFlushes - before.fusionFlushes;
    if (fusedCalls != static_cast<uint64_t>(calls + 1) || flushes >= fusedCalls) {
      return "not fused: " + std::to_string(fusedCalls) + " calls in " + std::to_string(flushes) +
             " batches";
    }
    for (int i = 0; i <= calls; ++i) {
      std::vector<float> alone = input(i, fused[i].size());
      comm.allreduceSync({{alone.data(), alone.size()}}, DataType::kFloat32, ReduceOp::kSum);
      for (size_t j = 0; j < alone.size(); ++j) {
        if (std::memcmp(&alone[j], &fused[i][j], sizeof(float)) != 0) {
          return "call " + std::to_string(i) + " element " + std::to_string(j) + ": fused " +
                 std::to_string(fused[i][j]) + ", alone " + std::to_string(alone[j]);
        }
        // It crossed in bf16: the result is a bf16 value.
        uint32_t b;
        std::memcpy(&b, &alone[j], sizeof(b));
        if (std::isfinite(alone[j]) && (b & 0xffffu) != 0) {
          return "call " + std::to_string(i) + " element " + std::to_string(j) + " = " +
                 std::to_string(alone[j]) + " is not a bf16 value";
        }
      }
    }
    return "";
  }, std::chrono::milliseconds(30000), std::chrono::seconds(120), [](int r) {
    setenv("SMDDP_HOST_ID", ("host" + std::to_string(r)).c_str(), 1);
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << results[r]);
    CHECK(results[r] == "");
  }
}

TEST_CASE("batches of every wire form and element size in turn read none of each other's bytes",
          "[cross_host][hosts]") {
  // The hosts' servers keep their cross-host buffers from batch to batch
  // (CallMemory::scratch), so a batch must write every
  // byte it reads there. Each call below has new values and a closed form,
  // and the calls take turns: f32 crossing in bf16, f64 (8-byte partials),
  // f32 MAX (not narrowed), in sizes of one step and of many.
  ScopedEnv env("SMDDP_CROSS_HOST_DTYPE", "bf16");
  auto results = runWorld(4, [](Communicator& comm) -> std::string {
    if (!usesHostPath(comm)) return "the group did not take the shared-memory path";
    const int r = comm.rank(), n = comm.size();
    for (int i = 0; i < 6; ++i) {
      const size_t count = i % 2 ? 300007 : 1000 + 77 * i;
      // Small integers: exact in bf16 (no sum passes 4 x 31 = 124), so
      // the closed form holds to the last bit.
      auto val = [i](int rank, size_t j) { return static_cast<double>((rank + 1) * (i + 1) + j % 8); };
      std::vector<float> f(count), m(count);
      std::vector<double> d(count);
      for (size_t j = 0; j < count; ++j) {
        f[j] = static_cast<float>(val(r, j));
        d[j] = val(r, j) * 0.5 + 0.25;
        m[j] = static_cast<float>(val(r, j) * ((j + r) % 3 == 0 ? -1 : 1));
      }
      comm.allreduceSync({{f.data(), count}}, DataType::kFloat32, ReduceOp::kSum);
      comm.allreduceSync({{d.data(), count}}, DataType::kFloat64, ReduceOp::kSum);
      comm.allreduceSync({{m.data(), count}}, DataType::kFloat32, ReduceOp::kMax);
      for (size_t j = 0; j < count; ++j) {
        double sum = 0, dsum = 0;
        float mx = -std::numeric_limits<float>::infinity();
        for (int q = 0; q < n; ++q) {
          sum += val(q, j);
          dsum += val(q, j) * 0.5 + 0.25;
          mx = std::max(mx, static_cast<float>(val(q, j) * ((j + q) % 3 == 0 ? -1 : 1)));
        }
        if (f[j] != sum || d[j] != dsum || m[j] != mx) {
          return "round " + std::to_string(i) + " element " + std::to_string(j) + ": f32 " +
                 std::to_string(f[j]) + " (want " + std::to_string(sum) + "), f64 " +
                 std::to_string(d[j]) + " (want " + std::to_string(dsum) + "), max " +
                 std::to_string(m[j]) + " (want " + std::to_string(mx) + ")";
        }
      }
    }
    return "";
  }, std::chrono::milliseconds(30000), std::chrono::seconds(120), [](int r) {
    setenv("SMDDP_HOST_ID", ("host" + std::to_string(r / 2)).c_str(), 1);
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r]);
    CHECK(results[r] == "");
  }
}
