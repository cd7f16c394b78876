#include "common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <memory>

#include "common/error.h"

namespace smddp {

void cryptoInit() {
  SMDDP_CHECK(OPENSSL_init_crypto(0, nullptr) == 1, kInternal,
              "smddp: OpenSSL's libcrypto did not start (OPENSSL_init_crypto)");
}

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

X25519KeyPair::~X25519KeyPair() {
  if (!privateKey.empty()) OPENSSL_cleanse(privateKey.data(), privateKey.size());
}

namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

Pkey x25519Private(std::string_view key) {
  SMDDP_CHECK(key.size() == kX25519Bytes, kInvalidArgument,
              "smddp: an X25519 private key is 32 bytes, not " + std::to_string(key.size()));
  Pkey k(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr,
                                      reinterpret_cast<const unsigned char*>(key.data()),
                                      key.size()));
  SMDDP_CHECK(k != nullptr, kInternal, "smddp: OpenSSL refused an X25519 private key");
  return k;
}

}  // namespace

X25519KeyPair x25519KeyPair() {
  std::string raw(kX25519Bytes, '\0');
  randomBytes(raw.data(), raw.size());
  X25519KeyPair pair = x25519KeyPair(raw);
  OPENSSL_cleanse(raw.data(), raw.size());
  return pair;
}

X25519KeyPair x25519KeyPair(std::string_view privateKey) {
  Pkey k = x25519Private(privateKey);
  X25519KeyPair pair;
  pair.privateKey.assign(privateKey);
  pair.publicKey.assign(kX25519Bytes, '\0');
  size_t n = kX25519Bytes;
  SMDDP_CHECK(EVP_PKEY_get_raw_public_key(
                  k.get(), reinterpret_cast<unsigned char*>(pair.publicKey.data()), &n) == 1 &&
                  n == kX25519Bytes,
              kInternal, "smddp: X25519 public key derivation failed");
  return pair;
}

std::string x25519SharedSecret(std::string_view privateKey, std::string_view publicKey,
                               const std::string& whose) {
  SMDDP_CHECK(publicKey.size() == kX25519Bytes, kInvalidArgument,
              "smddp: " + whose + "'s X25519 public key is " + std::to_string(publicKey.size()) +
                  " bytes, not 32");
  Pkey mine = x25519Private(privateKey);
  Pkey theirs(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr,
                                          reinterpret_cast<const unsigned char*>(publicKey.data()),
                                          publicKey.size()));
  SMDDP_CHECK(theirs != nullptr, kInvalidArgument,
              "smddp: " + whose + "'s X25519 public key is not a valid key");
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> c(EVP_PKEY_CTX_new(mine.get(), nullptr));
  std::string secret(kX25519Bytes, '\0');
  size_t n = secret.size();
  // OpenSSL fails the derivation when the result is all zero (RFC 7748,
  // section 6.1: a low-order public key).
  const bool ok = c && EVP_PKEY_derive_init(c.get()) == 1 &&
                  EVP_PKEY_derive_set_peer(c.get(), theirs.get()) == 1 &&
                  EVP_PKEY_derive(c.get(), reinterpret_cast<unsigned char*>(secret.data()), &n) ==
                      1 &&
                  n == kX25519Bytes;
  SMDDP_CHECK(ok && secret != std::string(kX25519Bytes, '\0'), kInvalidArgument,
              "smddp: " + whose + "'s X25519 public key gives no usable shared secret "
              "(a low-order point)");
  return secret;
}

bool macEquals(const Mac& a, const uint8_t* b) {
  return CRYPTO_memcmp(a.bytes, b, kMacBytes) == 0;
}

bool tagEquals(const Tag& a, const uint8_t* b) {
  return CRYPTO_memcmp(a.bytes, b, kTagBytes) == 0;
}

bool bytesEqual(const uint8_t* a, const uint8_t* b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

void wipe(std::string& secret) {
  if (!secret.empty()) OPENSSL_cleanse(secret.data(), secret.size());
}

}  // namespace smddp
