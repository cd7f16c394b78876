// What encrypting the peer wire's bulk data would cost on one core
// (docs/notes/2026-12-02-peer-wire-encryption.md): AES-256-GCM seal and
// open (common/crypto.h) of one chunk, in place and into a staging copy,
// against a plain copy of the same bytes, at the chunk sizes the network
// path sends. Prints a table; nothing is asserted.
//   build/smddp_wire_encrypt_cost [MiB per size]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/crypto.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;

namespace {

// GB/s of `fn` over `bytes`, repeated until `total` bytes went through.
template <class Fn>
double rate(size_t bytes, size_t total, Fn fn) {
  fn();  // warm the pages and the key schedule
  const size_t reps = std::max<size_t>(1, total / bytes);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < reps; ++i) fn();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(bytes) * static_cast<double>(reps) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t total = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 512) << 20;
  const std::string key = randomHex(16);  // 32 bytes
  uint8_t nonce[kGmacNonceBytes] = {};
  std::printf("%10s %12s %12s %12s %12s\n", "chunk", "copy GB/s", "seal GB/s", "seal+copy",
              "open GB/s");
  for (size_t kib : {64, 256, 1024, 4096}) {
    const size_t bytes = kib << 10;
    std::vector<uint8_t> src(bytes, 7), dst(bytes), tagged(bytes);
    const double copy = rate(bytes, total, [&] { std::memcpy(dst.data(), src.data(), bytes); });
    // In place: what a receive could do where it lands.
    const double seal = rate(bytes, total, [&] {
      ++nonce[0];
      (void)aesGcmSeal(key, nonce, "hdr", dst.data(), dst.data(), bytes);
    });
    // Into a staging buffer: the sender must not change the caller's tensor.
    const double staged = rate(bytes, total, [&] {
      ++nonce[0];
      (void)aesGcmSeal(key, nonce, "hdr", src.data(), dst.data(), bytes);
    });
    const Tag t = aesGcmSeal(key, nonce, "hdr", src.data(), tagged.data(), bytes);
    const double open = rate(bytes, total, [&] {
      std::memcpy(dst.data(), tagged.data(), bytes);  // the open is in place: restore it
      if (!aesGcmOpen(key, nonce, "hdr", dst.data(), dst.data(), bytes, t.bytes)) std::abort();
    });
    std::printf("%8zu K %12.2f %12.2f %12.2f %12.2f\n", kib, copy, seal, staged, open);
  }
  return 0;
}
