// TROUPE_CHECK and the exceptions used inside folders. Header-only; depends on nothing.
// Internal code throws; public functions catch and return Result (see STYLE.md "Errors").
#pragma once

#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace troupe {

/// A broken invariant: a bug in troupe, never bad input.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// Bad input that a caller can describe to a user (a corrupt file, a malformed request).
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// printf-style formatting into a std::string.
[[gnu::format(printf, 1, 2)]] inline std::string strfmt(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out;
  if (n > 0) {
    out.resize(static_cast<size_t>(n));
    std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
  }
  va_end(ap2);
  return out;
}

namespace detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& msg) {
  throw InternalError(strfmt("%s:%d: check failed: %s: %s", file, line, cond, msg.c_str()));
}
}  // namespace detail

}  // namespace troupe

/// Throws InternalError with file:line when cond is false. Use for invariants only.
#define TROUPE_CHECK(cond, ...)                                                                 \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::troupe::detail::check_failed(__FILE__, __LINE__, #cond, ::troupe::strfmt(__VA_ARGS__)); \
  } while (0)

/// Throws InputError with a formatted message.
#define TROUPE_INPUT_ERROR(...) throw ::troupe::InputError(::troupe::strfmt(__VA_ARGS__))
