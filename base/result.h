// Result<T>: the value-or-error type returned by every folder's public functions.
// Member names follow std::expected so that a later switch is a rename. Header-only, no deps.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include "base/check.h"

namespace troupe {

/// What went wrong, in a form a caller can print as one line.
struct Error {
  int code = 0;         // the folder's Errc value; 0 means "unspecified"
  std::string message;  // what, where, expected and got
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like expected
  Result(Error error) : v_(std::move(error)) {}

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & {
    TROUPE_CHECK(has_value(), "Result::value() on error: %s", error_unchecked().message.c_str());
    return std::get<0>(v_);
  }
  const T& value() const& {
    TROUPE_CHECK(has_value(), "Result::value() on error: %s", error_unchecked().message.c_str());
    return std::get<0>(v_);
  }
  T&& value() && {
    TROUPE_CHECK(has_value(), "Result::value() on error: %s", error_unchecked().message.c_str());
    return std::get<0>(std::move(v_));
  }
  const Error& error() const {
    TROUPE_CHECK(!has_value(), "Result::error() on a value");
    return std::get<1>(v_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  const Error& error_unchecked() const {
    static const Error kNone{};
    return has_value() ? kNone : std::get<1>(v_);
  }
  std::variant<T, Error> v_;
};

/// Result for functions with no value.
struct Ok {};
using Status = Result<Ok>;

inline Error make_error(int code, std::string message) { return Error{code, std::move(message)}; }

}  // namespace troupe
