#include "common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <memory>

#include "common/error.h"

namespace smddp {

void randomBytes(void* out, size_t n) {
  SMDDP_CHECK(n <= static_cast<size_t>(INT32_MAX) &&
                  RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(n)) == 1,
              kInternal, "smddp: the system's random number generator failed (RAND_bytes)");
}

std::string randomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  randomBytes(raw.data(), raw.size());
  static const char* kDigits = "0123456789abcdef";
  std::string out(2 * bytes, '0');
  for (size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<uint8_t>(raw[i]);
    out[2 * i] = kDigits[b >> 4];
    out[2 * i + 1] = kDigits[b & 15];
  }
  OPENSSL_cleanse(raw.data(), raw.size());
  return out;
}

namespace {

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct MacCtxFree {
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

// OpenSSL's HMAC implementation, fetched once: immutable and shared by
// every thread (a fetch per call costs more than the MAC of a short message).
EVP_MAC* hmacAlgorithm() {
  static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  SMDDP_CHECK(mac, kInternal, "smddp: OpenSSL has no HMAC (EVP_MAC_fetch)");
  return mac;
}

}  // namespace

Mac hmacSha256(std::string_view key, std::initializer_list<std::string_view> parts) {
  Mac out;
  std::unique_ptr<EVP_MAC_CTX, MacCtxFree> c(EVP_MAC_CTX_new(hmacAlgorithm()));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                               OSSL_PARAM_construct_end()};
  size_t n = 0;
  bool ok = c && EVP_MAC_init(c.get(), reinterpret_cast<const unsigned char*>(key.data()),
                              key.size(), params) == 1;
  for (std::string_view p : parts) {
    ok = ok && EVP_MAC_update(c.get(), reinterpret_cast<const unsigned char*>(p.data()),
                              p.size()) == 1;
  }
  ok = ok && EVP_MAC_final(c.get(), out.bytes, &n, sizeof(out.bytes)) == 1 && n == kMacBytes;
  SMDDP_CHECK(ok, kInternal, "smddp: HMAC-SHA256 failed");
  return out;
}

namespace {

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};

}  // namespace

Tag aesGmac(std::string_view key, const uint8_t* nonce,
            std::initializer_list<std::string_view> parts) {
  SMDDP_CHECK(key.size() == kGmacKeyBytes, kInternal, "smddp: an AES-GMAC key is 32 bytes");
  Tag out;
  std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree> c(EVP_CIPHER_CTX_new());
  int n = 0;
  // GCM with every byte as additional authenticated data and no
  // plaintext: the tag is a MAC of the data (GMAC, NIST SP 800-38D).
  bool ok = c && EVP_EncryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr,
                                    reinterpret_cast<const unsigned char*>(key.data()),
                                    nonce) == 1;
  for (std::string_view p : parts) {
    // EVP takes int lengths: a part over 2 GiB goes in slices.
    for (size_t at = 0; ok && at < p.size(); at += 1u << 30) {
      const size_t len = std::min<size_t>(p.size() - at, 1u << 30);
      ok = EVP_EncryptUpdate(c.get(), nullptr, &n,
                             reinterpret_cast<const unsigned char*>(p.data() + at),
                             static_cast<int>(len)) == 1;
    }
  }
  ok = ok && EVP_EncryptFinal_ex(c.get(), nullptr, &n) == 1 &&
       EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, out.bytes) == 1;
  SMDDP_CHECK(ok, kInternal, "smddp: AES-GMAC failed");
  return out;
}

namespace {

// EVP takes int lengths: a buffer over 1 GiB goes through in slices.
bool gcmUpdate(EVP_CIPHER_CTX* c, bool encrypt, const uint8_t* in, uint8_t* out, size_t n) {
  int got = 0;
  for (size_t at = 0; at < n; at += 1u << 30) {
    const int len = static_cast<int>(std::min<size_t>(n - at, 1u << 30));
    const int ok = encrypt ? EVP_EncryptUpdate(c, out ? out + at : nullptr, &got, in + at, len)
                           : EVP_DecryptUpdate(c, out ? out + at : nullptr, &got, in + at, len);
    if (ok != 1) return false;
  }
  return true;
}

}  // namespace

Tag aesGcmSeal(std::string_view key, const uint8_t* nonce, std::string_view aad,
               const uint8_t* in, uint8_t* out, size_t n) {
  SMDDP_CHECK(key.size() == kGmacKeyBytes, kInternal, "smddp: an AES-GCM key is 32 bytes");
  Tag tag;
  std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree> c(EVP_CIPHER_CTX_new());
  int got = 0;
  bool ok = c && EVP_EncryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr,
                                    reinterpret_cast<const unsigned char*>(key.data()),
                                    nonce) == 1;
  ok = ok && gcmUpdate(c.get(), true, reinterpret_cast<const uint8_t*>(aad.data()), nullptr,
                       aad.size());
  ok = ok && gcmUpdate(c.get(), true, in, out, n);
  ok = ok && EVP_EncryptFinal_ex(c.get(), nullptr, &got) == 1 &&
       EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag.bytes) == 1;
  SMDDP_CHECK(ok, kInternal, "smddp: AES-GCM encryption failed");
  return tag;
}

bool aesGcmOpen(std::string_view key, const uint8_t* nonce, std::string_view aad,
                const uint8_t* in, uint8_t* out, size_t n, const uint8_t* tag) {
  SMDDP_CHECK(key.size() == kGmacKeyBytes, kInternal, "smddp: an AES-GCM key is 32 bytes");
  std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree> c(EVP_CIPHER_CTX_new());
  int got = 0;
  uint8_t expected[kTagBytes];
  std::copy(tag, tag + kTagBytes, expected);
  bool ok = c && EVP_DecryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr,
                                    reinterpret_cast<const unsigned char*>(key.data()),
                                    nonce) == 1;
  ok = ok && gcmUpdate(c.get(), false, reinterpret_cast<const uint8_t*>(aad.data()), nullptr,
                       aad.size());
  ok = ok && gcmUpdate(c.get(), false, in, out, n);
  SMDDP_CHECK(ok && EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, expected) == 1,
              kInternal, "smddp: AES-GCM decryption failed");
  // The final step compares the tags (in constant time) and fails on a mismatch.
  return EVP_DecryptFinal_ex(c.get(), nullptr, &got) == 1;
}

uint64_t sha256Prefix64(std::initializer_list<std::string_view> parts) {
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> c(EVP_MD_CTX_new());
  uint8_t digest[32];
  unsigned int n = 0;
  bool ok = c && EVP_DigestInit_ex(c.get(), EVP_sha256(), nullptr) == 1;
  for (std::string_view p : parts) ok = ok && EVP_DigestUpdate(c.get(), p.data(), p.size()) == 1;
  ok = ok && EVP_DigestFinal_ex(c.get(), digest, &n) == 1;
  SMDDP_CHECK(ok, kInternal, "smddp: SHA-256 failed");
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | digest[i];
  return v;
}

bool macEquals(const Mac& a, const uint8_t* b) {
  return CRYPTO_memcmp(a.bytes, b, kMacBytes) == 0;
}

bool tagEquals(const Tag& a, const uint8_t* b) {
  return CRYPTO_memcmp(a.bytes, b, kTagBytes) == 0;
}

}  // namespace smddp
