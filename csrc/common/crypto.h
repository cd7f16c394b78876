// The few cryptographic primitives smddp needs, over OpenSSL's libcrypto
// (never hand-rolled): random bytes for nonces, keys and names nobody can
// guess, HMAC-SHA256 for proofs of a shared key, AES-GMAC for the
// integrity of bulk frames, SHA-256 for one-way identifiers, X25519 for
// the keys a group's ranks agree on without sending them, and a comparison
// whose time does not depend on where two MACs differ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace smddp {

constexpr size_t kMacBytes = 32;  // HMAC-SHA256
struct Mac {
  uint8_t bytes[kMacBytes] = {};
};
constexpr size_t kTagBytes = 16;  // AES-GMAC
struct Tag {
  uint8_t bytes[kTagBytes] = {};
};
constexpr size_t kGmacKeyBytes = 32;
constexpr size_t kGmacNonceBytes = 12;

// Starts OpenSSL now (OPENSSL_init_crypto), which registers its exit
// handler: a handler registered with atexit after this call runs before
// OpenSSL tears itself down. Throws kInternal if OpenSSL cannot start.
void cryptoInit();
// `n` bytes from the OS's CSPRNG (RAND_bytes); throws kInternal if it fails.
void randomBytes(void* out, size_t n);
// 2 * `bytes` lowercase hex digits of random bytes: names and generated keys.
std::string randomHex(size_t bytes);

// HMAC-SHA256 of the concatenation of `parts` under `key`.
Mac hmacSha256(std::string_view key, std::initializer_list<std::string_view> parts);
// AES-256-GMAC (GCM over no plaintext) of the concatenation of `parts`
// under a 32-byte `key` and a 12-byte `nonce`: a MAC five times cheaper
// per byte than HMAC-SHA256 where the CPU has AES and carry-less multiply
// instructions, for bulk data. A nonce must never repeat under one key.
Tag aesGmac(std::string_view key, const uint8_t* nonce,
            std::initializer_list<std::string_view> parts);
// AES-256-GCM (NIST SP 800-38D) under a 32-byte `key` and a 12-byte
// `nonce`: encrypts `n` bytes from `in` to `out` (they may be the same
// buffer) and returns the tag over `aad` and the ciphertext. A nonce must
// never repeat under one key.
Tag aesGcmSeal(std::string_view key, const uint8_t* nonce, std::string_view aad,
               const uint8_t* in, uint8_t* out, size_t n);
// The reverse: decrypts `n` bytes from `in` to `out` (may be the same) and
// returns whether `tag` (kTagBytes) matches `aad` and the ciphertext. When
// it does not, `out` holds garbage the caller must discard.
bool aesGcmOpen(std::string_view key, const uint8_t* nonce, std::string_view aad,
                const uint8_t* in, uint8_t* out, size_t n, const uint8_t* tag);
// The first 8 bytes of SHA-256 of the concatenation of `parts`.
uint64_t sha256Prefix64(std::initializer_list<std::string_view> parts);

// Whether two MACs (tags) are equal, in time independent of their contents.
bool macEquals(const Mac& a, const uint8_t* b);
bool tagEquals(const Tag& a, const uint8_t* b);
bool bytesEqual(const uint8_t* a, const uint8_t* b, size_t n);
// Overwrites a secret's bytes (in a way the compiler keeps).
void wipe(std::string& secret);

constexpr size_t kX25519Bytes = 32;
// An ephemeral X25519 key pair (RFC 7748), raw bytes: the private key is
// wiped when the pair goes.
struct X25519KeyPair {
  std::string privateKey;  // kX25519Bytes
  std::string publicKey;   // kX25519Bytes
  X25519KeyPair() = default;
  X25519KeyPair(const X25519KeyPair&) = delete;
  X25519KeyPair& operator=(const X25519KeyPair&) = delete;
  X25519KeyPair(X25519KeyPair&&) = default;
  X25519KeyPair& operator=(X25519KeyPair&&) = default;
  ~X25519KeyPair();
};
// A fresh pair from the OS's CSPRNG; or the pair of a given 32-byte
// private key (tests: RFC 7748's vectors). Throws kInvalidArgument for a
// private key of another size.
X25519KeyPair x25519KeyPair();
X25519KeyPair x25519KeyPair(std::string_view privateKey);
// The 32-byte shared secret of `privateKey` and a peer's `publicKey`.
// Throws kInvalidArgument, naming `whose`, for a public key that is not
// 32 bytes or one that yields the all-zero secret (a low-order point: a
// forger's way to force a known key).
std::string x25519SharedSecret(std::string_view privateKey, std::string_view publicKey,
                               const std::string& whose);

// A view of raw bytes, for the `parts` above.
inline std::string_view bytesOf(const void* p, size_t n) {
  return std::string_view(static_cast<const char*>(p), n);
}

}  // namespace smddp
