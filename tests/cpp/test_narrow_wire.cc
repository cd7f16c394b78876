// The narrow-wire reduction (reduce/narrow_wire.h, combineNarrowWire and
// serveNarrowWire): the one copy that the network-only path's rank
// servers, the hierarchy's host servers and the standalone servers share.
//
// Oracles: a closed form from reduce_reference.h's scalar conversions
// (each piece's scale by the header's rule, every element read back, the
// pieces summed in f32 strictly in order, the sum packed and read back the
// same way), bitwise; and an f64 sum within the design's bound, reached in
// part (so a path that did not round, or a bound too loose, fails). Then
// each path that serves a narrow step, bitwise against the shared function
// on the same inputs and against the closed form: a standalone server
// (bf16 and fp16, several of its chunks), the network-only path (3 x 1
// pretend hosts) and the hierarchy's host servers (2 x 2). On the two
// in-group paths a server rounds per chunk or piece; the inputs keep bf16's
// scale at 1 there, where the chunking does not change the bits.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/communicator.h"
#include "reduce/narrow_wire.h"
#include "reduce/reduce_kernels.h"
#include "reduce_reference.h"
#include "server_test_frames.h"
#include "world.h"

using namespace smddp;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;
using smddp::test::usesHostPath;
using namespace reduce_ref;
using Pieces = std::vector<std::vector<float>>;

namespace {


// Element j of piece p: 24 random significant bits, magnitudes 2^-20 to
// 2^20, either sign, so f32 sums round and their order shows.
float ordinary(int p, size_t j) {
  const uint64_t h = mix((static_cast<uint64_t>(p) << 40) ^ j);
  const double m = 1.0 + static_cast<double>(h >> 40) * 0x1.0p-24;
  return static_cast<float>(((h & 1) ? m : -m) * std::ldexp(1.0, static_cast<int>(h % 41) - 20));
}
// A multiple of 2^-12 below 2^6: two of them add exactly in f32, but not
// in bf16's 8 significant bits.
float exactPair(int p, size_t j) {
  const uint64_t h = mix((static_cast<uint64_t>(p) << 40) ^ j ^ 0x5555);
  return static_cast<float>(static_cast<int64_t>(h % (1u << 18)) - (1 << 17)) * 0x1.0p-12f;
}

// The header's scale rule, computed here independently.
float refScale(const std::vector<float>& x, DataType wire) {
  double m = 0;
  for (float v : x) {
    if (std::isfinite(v)) m = std::max(m, std::fabs(static_cast<double>(v)));
  }
  if (m == 0) return 1.0f;
  int e = 0;
  std::frexp(m, &e);
  const int se = wire == DataType::kFloat16 ? 15 - e : std::min(0, 127 - e);
  return std::ldexp(1.0f, std::max(-126, std::min(127, se)));
}

// x packed with `scale` and read back, by the reference conversions.
float refRead(float x, float scale, DataType wire) {
  const float s = x * scale;
  const float w = wire == DataType::kFloat16 ? refHalfToFloat(refFloatToHalf(s))
                                             : refBf16ToFloat(refFloatToBf16(s));
  const float v = w / scale;
  if (std::isinf(v) && !std::isinf(w)) return std::copysign(std::numeric_limits<float>::max(), v);
  return v;
}

// The closed form: what every rank reads back.
std::vector<float> closedForm(const Pieces& in, DataType wire, ReduceOp op, double divisor) {
  const size_t count = in[0].size();
  std::vector<float> sum(count, 0.0f);
  for (size_t p = 0; p < in.size(); ++p) {
    const float scale = refScale(in[p], wire);
    for (size_t j = 0; j < count; ++j) {
      const float v = refRead(in[p][j], scale, wire);
      sum[j] = p == 0 ? v : sum[j] + v;
    }
  }
  if (op == ReduceOp::kAvg) {
    for (float& s : sum) s /= static_cast<float>(divisor);
  }
  const float scale = refScale(sum, wire);
  for (float& s : sum) s = refRead(s, scale, wire);
  return sum;
}

// combineNarrowWire on `in` packed whole, its result read back.
std::vector<float> shared(const Pieces& in, DataType wire, ReduceOp op, double divisor) {
  const size_t count = in[0].size();
  std::vector<std::vector<uint8_t>> packed(in.size());
  std::vector<const void*> pieces;
  std::vector<float> scratch((in.size() + 1) * std::max<size_t>(1, count));
  for (size_t p = 0; p < in.size(); ++p) {
    packed[p].resize(narrowWireBytes(count, wire));
    packNarrowWire(packed[p].data(), in[p].data(), count, wire, scratch.data());
    pieces.push_back(packed[p].data());
  }
  std::vector<uint8_t> result(narrowWireBytes(count, wire));
  std::vector<float> sum(count), out(count);
  if (combineNarrowWire(result.data(), sum.data(), pieces.data(), in.size(), count, wire, op,
                        divisor, scratch.data()) != -1 ||
      !unpackNarrowWire(out.data(), result.data(), count, wire)) {
    throw std::runtime_error("the shared reduction refused its own pieces");
  }
  return out;
}

// "" if a and b hold the same bits, else the first difference.
std::string sameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  if (a.size() != b.size()) return std::string(what) + ": sizes differ";
  for (size_t j = 0; j < a.size(); ++j) {
    if (std::memcmp(&a[j], &b[j], sizeof(float)) != 0 && !(std::isnan(a[j]) && std::isnan(b[j]))) {
      return std::string(what) + ": element " + std::to_string(j) + " is " +
             std::to_string(a[j]) + ", not " + std::to_string(b[j]);
    }
  }
  return "";
}

Pieces makePieces(int n, size_t count, float (*value)(int, size_t)) {
  Pieces in(n, std::vector<float>(count));
  for (int p = 0; p < n; ++p) {
    for (size_t j = 0; j < count; ++j) in[p][j] = value(p, j);
  }
  return in;
}

}  // namespace

TEST_CASE("the narrow-wire reduction gives the closed form's bits, within the f64 bound",
          "[cross_host][reduce]") {
  const DataType wire = GENERATE(DataType::kBFloat16, DataType::kFloat16);
  const ReduceOp op = GENERATE(ReduceOp::kSum, ReduceOp::kAvg);
  const bool scalar = GENERATE(false, true);
  const bool wasScalar = setForceScalarKernels(scalar);
  const int n = 4;
  // Past two of the shared function's ranges, and odd.
  const size_t count = 2 * kNarrowWireScratch + 1001;
  Pieces in = makePieces(n, count, ordinary);
  // fp16 always scales; one piece past bf16's range scales it too.
  if (wire == DataType::kBFloat16) in[2][5] = 3e38f;
  INFO(toString(wire) << (op == ReduceOp::kSum ? " SUM" : " AVG") << (scalar ? ", scalar" : ""));
  const std::vector<float> want = closedForm(in, wire, op, n);
  CHECK(sameBits(shared(in, wire, op, n), want, "combineNarrowWire") == "");

  // serveNarrowWire: piece 1 is the server's own, in f32, summed in place.
  std::vector<std::vector<uint8_t>> packed(n);
  std::vector<const void*> pieces(n);
  std::vector<float> scratch((n + 1) * kNarrowWireScratch);
  for (int p = 0; p < n; ++p) {
    packed[p].resize(narrowWireBytes(count, wire));
    if (p != 1) packNarrowWire(packed[p].data(), in[p].data(), count, wire, scratch.data());
    pieces[p] = packed[p].data();
  }
  std::vector<float> own = in[1];
  REQUIRE(serveNarrowWire(own.data(), packed[1].data(), pieces.data(), n, 1, count, wire, op, n,
                          scratch.data()) == -1);
  CHECK(sameBits(own, want, "serveNarrowWire's own") == "");
  std::vector<float> read(count);
  REQUIRE(unpackNarrowWire(read.data(), packed[1].data(), count, wire));
  CHECK(sameBits(read, want, "serveNarrowWire's wire bytes") == "");

  // The f64 oracle: each input and the result rounded once, f32 sums
  // (docs/design.md, "Compression between hosts"); fp16 adds half its
  // subnormal spacing at each piece's scale and the result's.
  const double u = wire == DataType::kFloat16 ? 0x1.0p-11 : 0x1.0p-8;
  double floorTerm = 0, maxSum = 0;
  for (size_t j = 0; j < count; ++j) {
    double s = 0;
    for (int p = 0; p < n; ++p) s += in[p][j];
    maxSum = std::max(maxSum, std::fabs(s));
  }
  if (wire == DataType::kFloat16) {
    for (int p = 0; p < n; ++p) {
      double m = 0;
      for (float v : in[p]) m = std::max(m, std::fabs(static_cast<double>(v)));
      floorTerm += 0x1.0p-39 * m;
    }
    floorTerm += 0x1.0p-39 * maxSum;
  }
  double worst = 0;
  for (size_t j = 0; j < count; ++j) {
    double exact = 0, mag = 0;
    for (int p = 0; p < n; ++p) {
      exact += in[p][j];
      mag += std::fabs(in[p][j]);
    }
    double bound = 1.01 * (u * (mag + std::fabs(exact)) + n * 0x1.0p-24 * mag) + floorTerm;
    if (op == ReduceOp::kAvg) {
      exact /= n;
      bound = bound / n + 0x1.0p-23 * std::fabs(exact);
    }
    const double err = std::fabs(static_cast<double>(want[j]) - exact);
    INFO("element " << j);
    REQUIRE(err <= bound);
    if (j != 5) worst = std::max(worst, err / bound);
  }
  CHECK(worst > 0.05);
  // A broken scale is named by its piece's index.
  const float bad = 3.0f;
  std::memcpy(packed[3].data(), &bad, sizeof(float));
  std::vector<float> sum(count);
  CHECK(combineNarrowWire(packed[0].data(), sum.data(), pieces.data(), n, count, wire, op, n,
                          scratch.data()) == 3);
  setForceScalarKernels(wasScalar);
}

TEST_CASE("a standalone server's narrow step has the shared reduction's bits", "[server]") {
  StandaloneServer server(testServer(1));
  const auto servers = loopback(server);
  const int H = 3;
  uint64_t group = 800;
  for (DataType wire : {DataType::kBFloat16, DataType::kFloat16}) {
    for (size_t count : {size_t{1}, size_t{1000}, kNarrowWireScratch + 777}) {
      CAPTURE(toString(wire), count);
      const Pieces in = makePieces(H, count, ordinary);
      std::vector<std::vector<float>> out(H);
      std::vector<std::string> errors(H);
      std::vector<std::thread> hosts;
      for (int h = 0; h < H; ++h) {
        hosts.emplace_back([&, h] {
          try {
            auto links = testLinks(servers, H, h, "", group);
            std::vector<float> scratch(count);
            std::vector<uint8_t> packed(narrowWireBytes(count, wire)), result(packed.size());
            packNarrowWire(packed.data(), in[h].data(), count, wire, scratch.data());
            ServerFrame f = dataFrame(count, wire);
            f.flags = kServerFlagNarrowWire;
            f.payload = packed.size();
            links->wait(0, links->post(0, f, packed.data(), result.data()),
                        std::chrono::steady_clock::now() + std::chrono::seconds(20), nullptr);
            out[h].assign(count, -1.0f);
            if (!unpackNarrowWire(out[h].data(), result.data(), count, wire)) errors[h] = "unpack";
          } catch (const std::exception& e) {
            errors[h] = e.what();
          }
        });
      }
      for (auto& t : hosts) t.join();
      ++group;
      const auto want = shared(in, wire, ReduceOp::kSum, 1.0);
      CHECK(sameBits(want, closedForm(in, wire, ReduceOp::kSum, 1.0), "closed form") == "");
      for (int h = 0; h < H; ++h) {
        INFO("host " << h << ": " << errors[h]);
        REQUIRE(errors[h] == "");
        CHECK(sameBits(out[h], want, "server") == "");
      }
    }
  }
}

namespace {

// Every rank of `hosts` x `perHost` pretend hosts allreduces in bf16
// across hosts; each checks its bits against the shared function and the
// closed form over the host partials (exact in f32 where perHost > 1).
void runPath(int hosts, int perHost) {
  const int n = hosts * perHost;
  ScopedEnv env("SMDDP_CROSS_HOST_DTYPE", "bf16");
  auto results = runWorld(n, [=](Communicator& comm) -> std::string {
    if (usesHostPath(comm) != (perHost > 1)) return "not the expected path";
    auto value = perHost > 1 ? exactPair : ordinary;
    const size_t N = 300007;  // several chunks and pipeline steps of every shard
    Pieces partials = makePieces(hosts, N, [](int, size_t) { return 0.0f; });
    for (int r = 0; r < n; ++r) {
      for (size_t j = 0; j < N; ++j) partials[r / perHost][j] += value(r, j);
    }
    std::string failed;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<float> v(N);
      for (size_t j = 0; j < N; ++j) v[j] = value(comm.rank(), j);
      comm.allreduceSync({{v.data(), N}}, DataType::kFloat32, op);
      const auto want = shared(partials, DataType::kBFloat16, op, n);
      failed += sameBits(want, closedForm(partials, DataType::kBFloat16, op, n), "closed form");
      failed += sameBits(v, want, toString(op));
    }
    return failed;
  }, std::chrono::milliseconds(30000), std::chrono::seconds(120), [perHost](int r) {
    setenv("SMDDP_HOST_ID", ("host" + std::to_string(r / perHost)).c_str(), 1);
  });
  for (int r = 0; r < n; ++r) {
    INFO(hosts << " x " << perHost << ", rank " << r);
    CHECK(results[r] == "");
  }
}

}  // namespace

TEST_CASE("the network-only path's servers have the shared reduction's bits",
          "[cross_host][hosts]") {
  runPath(3, 1);
}

TEST_CASE("the hierarchy's host servers have the shared reduction's bits", "[cross_host][hosts]") {
  runPath(2, 2);
}
