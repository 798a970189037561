// Cluster-token proofs: HMAC-SHA256 over a purpose label and the parts of a handshake, and
// random nonces. Used by the transport handshake and by the controller's join (cluster.capnp).
// Thread safety: free functions, no shared state.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>

namespace troupe::transport {

using Digest = std::array<uint8_t, 32>;

/// HMAC-SHA256(key, label || parts...).
Digest hmac_sha256(std::string_view key, std::string_view label,
                   std::initializer_list<std::span<const uint8_t>> parts);
/// Compares in time independent of where the inputs differ.
bool digest_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);
/// Cryptographically random bytes (OpenSSL RAND_bytes). Throws std::runtime_error on failure.
void random_bytes(std::span<uint8_t> out);

}  // namespace troupe::transport
