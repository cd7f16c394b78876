// Linked by shared_libstdcxx.cmake to see how the compiler links libstdc++
// into a shared library, and by tests/python/test_static_libstdcxx.py,
// which loads it after torch: an integer written to a std::ostream.
#include <cstring>
#include <sstream>
#include <string>

extern "C" int smddp_libstdcxx_probe(long value, char* out, int size) {
  std::ostringstream s;
  s << "[probe " << value << "]";
  const std::string text = s.str();
  std::strncpy(out, text.c_str(), static_cast<size_t>(size));
  return static_cast<int>(text.size());
}
