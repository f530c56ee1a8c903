// Errors at the edges: bad files, bad requests and impossible settings throw roofline::Error with a
// one-line message; the CLI prints it and exits 1, the server turns it into an HTTP error envelope.
// ROOFLINE_CHECK is for internal invariants (bugs), never for validating input: it throws InternalError,
// which the server reports as its own fault (500), not the client's. DeviceFault is a device error
// that does not go away (a sticky CUDA error): every later step would fail too.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace roofline {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A failed internal check (a bug of ours, not bad input).
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& message) : Error(message) {}
};

// The accelerator is in an error state that later calls will report again (the CUDA context is lost);
// the server stops taking requests (503) instead of failing each one.
class DeviceFault : public Error {
 public:
  explicit DeviceFault(const std::string& message) : Error(message) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void internal_check_failed(const char* expr, const char* file, int line, const std::string& what);

}  // namespace roofline

#define ROOFLINE_CHECK(cond, ...)                                                                 \
  do {                                                                                            \
    if (!(cond)) ::roofline::internal_check_failed(#cond, __FILE__, __LINE__, fmt::format("" __VA_ARGS__)); \
  } while (0)
