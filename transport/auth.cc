// Cluster-token proofs with OpenSSL's libcrypto (see auth.h).
#include "transport/auth.h"

#include <stdexcept>
#include <string>

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace troupe::transport {

Digest hmac_sha256(std::string_view key, std::string_view label,
                   std::initializer_list<std::span<const uint8_t>> parts) {
  // One buffer, then the one-shot HMAC(): the HMAC_CTX API is deprecated in OpenSSL 3.
  size_t n = label.size();
  for (const auto& p : parts) n += p.size();
  std::string buf;
  buf.reserve(n);
  buf.append(label);
  for (const auto& p : parts) buf.append(reinterpret_cast<const char*>(p.data()), p.size());
  Digest out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(buf.data()), buf.size(), out.data(), &len) ||
      len != out.size())
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  return out;
}

bool digest_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void random_bytes(std::span<uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1)
    throw std::runtime_error("no random bytes from OpenSSL RAND_bytes");
}

}  // namespace troupe::transport
