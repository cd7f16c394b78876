// What SMDDP_SERVER_INTEGRITY and SMDDP_WIRE_ENCRYPT cost
// (docs/notes/2026-11-25-server-security.md, 2026-12-02-wire-encryption.md):
// a standalone server and two worker hosts in one process on loopback, each
// host posting pieces back to back with 16 in flight, timed plain, with a
// MAC on every frame, and encrypted; then the MAC and the cipher alone on
// one core, the cost's floor.
// On loopback nothing but the CPU limits the stream, so the difference is
// the MACs' cost at its largest: on a real link slower than the MACs it
// hides behind the transfer.
//   build/smddp_server_integrity [MiB per host] [piece KiB ...]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/crypto.h"
#include "server/server_link.h"
#include "server/standalone_server.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kKey = "bench key 0123456789abcdef0123456789abcdef";

// Seconds for each of 2 hosts to push `total` bytes in pieces of `piece`
// bytes through one server (float32 SUM), results read back in place.
enum class Wire { kPlain, kMac, kEncrypt };
double pushThrough(const StandaloneServer& server, uint64_t piece, uint64_t total, Wire wire) {
  const std::vector<ServerAddress> where = {{"127.0.0.1", server.ports()[0], "bench"}};
  std::vector<std::unique_ptr<ServerLinks>> links(2);
  for (int h = 0; h < 2; ++h) {
    ServerLinks::Identity me;
    me.group = 77;
    me.hosts = 2;
    me.host = me.rank = h;
    me.key = kKey;
    me.integrity = wire != Wire::kPlain;
    me.encrypt = wire == Wire::kEncrypt;
    me.maxPiece = piece;
    links[h] = std::make_unique<ServerLinks>(where, me, std::chrono::seconds(10));
  }
  const uint64_t count = piece / 4, pieces = total / piece;
  constexpr int kInFlight = 16;
  const auto t0 = Clock::now();
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; ++h) {
    hosts.emplace_back([&, h] {
      std::vector<std::vector<float>> slots(kInFlight, std::vector<float>(count, 1.0f));
      std::vector<uint64_t> tickets(kInFlight);
      const auto deadline = Clock::now() + std::chrono::seconds(600);
      for (uint64_t i = 0; i < pieces + kInFlight; ++i) {
        const int s = static_cast<int>(i % kInFlight);
        if (i >= kInFlight) links[h]->wait(0, tickets[s], deadline, nullptr);
        if (i >= pieces) continue;
        ServerFrame f;
        f.kind = static_cast<uint8_t>(ServerFrameKind::kData);
        f.dtype = static_cast<uint8_t>(DataType::kFloat32);
        f.op = static_cast<uint8_t>(ReduceOp::kSum);
        f.seq = 1;
        f.step = i;
        f.count = count;
        f.payload = piece;
        tickets[s] = links[h]->post(0, f, slots[s].data(), slots[s].data());
      }
    });
  }
  for (auto& t : hosts) t.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 512;
  std::vector<uint64_t> kib;
  for (int i = 2; i < argc; ++i) kib.push_back(std::strtoull(argv[i], nullptr, 10));
  if (kib.empty()) kib = {16, 128, 1024};
  StandaloneServer::Options o;
  o.bindAddress = "127.0.0.1";
  o.key = kKey;
  o.requireIntegrity = 0;
  o.encrypt = 0;
  StandaloneServer server(o);
  o.encrypt = 1;  // a worker and its server agree on encryption
  StandaloneServer encrypting(o);
  std::printf("2 hosts x %llu MiB through one server on loopback, 16 pieces in flight per host\n",
              static_cast<unsigned long long>(mib));
  std::printf("%10s %11s %11s %11s %9s %9s\n", "piece", "plain GB/s", "MAC GB/s", "enc GB/s",
              "MAC cost", "enc cost");
  for (uint64_t k : kib) {
    const uint64_t piece = k << 10, total = (mib << 20) / piece * piece;
    pushThrough(server, piece, std::min<uint64_t>(total, 64ull << 20), Wire::kPlain);  // warm up
    // Best of three each, the modes alternating: the machine is shared.
    double plain = 1e30, mac = 1e30, enc = 1e30;
    for (int r = 0; r < 3; ++r) {
      plain = std::min(plain, pushThrough(server, piece, total, Wire::kPlain));
      mac = std::min(mac, pushThrough(server, piece, total, Wire::kMac));
      enc = std::min(enc, pushThrough(encrypting, piece, total, Wire::kEncrypt));
    }
    // Bytes into the server from both hosts, per second.
    const double gb = 2.0 * total / 1e9;
    std::printf("%7llu KiB %11.2f %11.2f %11.2f %8.0f%% %8.0f%%\n",
                static_cast<unsigned long long>(k), gb / plain, gb / mac, gb / enc,
                100.0 * (mac - plain) / plain, 100.0 * (enc - plain) / plain);
  }
  // The MACs alone, one core: each byte is MACed four times on this path
  // (a worker seals its piece, the server checks it, the server seals each
  // host's result, the worker checks it). The frames take AES-256-GMAC;
  // HMAC-SHA256, which the handshake's proofs take, for comparison.
  std::vector<uint8_t> buf(4 << 20, 7);
  const std::string key(kGmacKeyBytes, 'k');
  const uint8_t nonce[kGmacNonceBytes] = {};
  auto rate = [&](auto&& mac) {
    const auto t0 = Clock::now();
    int n = 0;
    for (; std::chrono::duration<double>(Clock::now() - t0).count() < 1.0; ++n) mac();
    return n * 4.0 * (1 << 20) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  };
  volatile uint8_t sink = 0;
  const std::string_view all = bytesOf(buf.data(), buf.size());
  const double gmac = rate([&] { sink = aesGmac(key, nonce, {all}).bytes[0]; });
  const double hmac = rate([&] { sink = hmacSha256(key, {all}).bytes[0]; });
  // Encrypted frames take AES-256-GCM, in place here as the reader decrypts.
  const double gcm = rate([&] {
    sink = aesGcmSeal(key, nonce, "", buf.data(), buf.data(), buf.size()).bytes[0];
  });
  (void)sink;
  std::printf("one core: AES-256-GMAC %.2f GB/s, AES-256-GCM %.2f GB/s, HMAC-SHA256 %.2f GB/s\n",
              gmac, gcm, hmac);
  return 0;
}
