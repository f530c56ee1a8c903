// Internal invariant failures: reported as an Error carrying the place, so a request fails, not the process.
#include "core/error.h"

namespace roofline {

void internal_check_failed(const char* expr, const char* file, int line, const std::string& what) {
  throw InternalError(fmt::format("internal error: {} failed at {}:{}{}{}", expr, file, line, what.empty() ? "" : ": ", what));
}

}  // namespace roofline
