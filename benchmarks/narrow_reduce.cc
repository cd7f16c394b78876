// What a reduction server spends on one chunk of bf16 crossing hosts
// (docs/notes/2026-11-27-network-fusion-copies.md): n wire pieces read back
// and summed in f32, by reduceNarrowWire (one pass when every scale is 1)
// and the way the servers did it before (each piece unpacked into f32,
// then reduceOrdered over the floats). Both give the same bits; the
// benchmark checks that before it times them. One thread.
//   build/smddp_narrow_reduce [elements per chunk] [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "reduce/narrow_wire.h"
#include "reduce/reduce_kernels.h"

using namespace smddp;

int main(int argc, char** argv) {
  const size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 65536;  // 128 KiB
  const int iters = argc > 2 ? std::atoi(argv[2]) : 2000;
  const DataType wire = DataType::kBFloat16;
  std::printf("bf16 pieces of %zu elements, %d iterations, %s kernels; us per chunk\n", count,
              iters, reduceKernelIsa());
  std::printf("%4s %16s %12s %8s\n", "n", "unpack + reduce", "one pass", "speed-up");
  for (size_t n : {2, 4, 7, 8}) {
    std::vector<std::vector<unsigned char>> packed(n);
    std::vector<const void*> pieces(n);
    std::vector<float> x(count), scratch(count), wide(n * count), before(count), after(count);
    for (size_t p = 0; p < n; ++p) {
      for (size_t j = 0; j < count; ++j) x[j] = 0.001f * static_cast<float>((j * 7 + p) % 1000);
      packed[p].resize(narrowWireBytes(count, wire));
      packNarrowWire(packed[p].data(), x.data(), count, wire, scratch.data());
      pieces[p] = packed[p].data();
    }
    auto unpackThenReduce = [&] {
      std::vector<const void*> in(n);
      for (size_t p = 0; p < n; ++p) {
        if (!unpackNarrowWire(wide.data() + p * count, pieces[p], count, wire)) std::abort();
        in[p] = wide.data() + p * count;
      }
      reduceOrdered(before.data(), in.data(), n, count, DataType::kFloat32, ReduceOp::kSum);
    };
    auto onePass = [&] {
      if (reduceNarrowWire(after.data(), pieces.data(), n, count, wire, ReduceOp::kSum, 1.0,
                           wide.data()) != -1) {
        std::abort();
      }
    };
    unpackThenReduce();
    onePass();
    if (std::memcmp(before.data(), after.data(), count * sizeof(float)) != 0) {
      std::printf("n=%zu: the two ways differ\n", n);
      return 1;
    }
    auto time = [&](auto&& f) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) f();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
             iters * 1e6;
    };
    double a = time(unpackThenReduce), b = time(onePass);  // ABBA
    b = (b + time(onePass)) / 2;
    a = (a + time(unpackThenReduce)) / 2;
    std::printf("%4zu %16.1f %12.1f %7.2fx\n", n, a, b, a / b);
  }
  return 0;
}
