#include "observe/pickle_writer.h"

#include <cstring>

namespace smddp {

namespace {

void littleEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

void PickleWriter::str(const std::string& s) {
  out_ += 'X';  // BINUNICODE: 4-byte little-endian length, UTF-8
  littleEndian(out_, s.size(), 4);
  out_ += s;
}

void PickleWriter::integer(int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    out_ += 'J';  // BININT: 4-byte signed little-endian
    littleEndian(out_, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    return;
  }
  out_ += '\x8a';  // LONG1: 8 bytes of two's complement
  out_ += '\x08';
  littleEndian(out_, static_cast<uint64_t>(v), 8);
}

void PickleWriter::real(double v) {
  out_ += 'G';  // BINFLOAT: 8-byte big-endian IEEE 754
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
}

}  // namespace smddp
