// The type table: names, block sizes and block bytes of every GGUF tensor type (ggml-common.h sizes).
#include "formats/dtype.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace roofline {
namespace {

struct Entry {
  uint32_t id;
  DTypeTraits traits;
};

constexpr Entry kEntries[] = {
    {0, {"f32", 1, 4, false, true}},
    {1, {"f16", 1, 2, false, true}},
    {2, {"q4_0", 32, 18, true, true}},
    {3, {"q4_1", 32, 20, true, true}},
    {6, {"q5_0", 32, 22, true, true}},
    {7, {"q5_1", 32, 24, true, true}},
    {8, {"q8_0", 32, 34, true, true}},
    {9, {"q8_1", 32, 36, true, false}},
    {10, {"q2_K", 256, 84, true, true}},
    {11, {"q3_K", 256, 110, true, true}},
    {12, {"q4_K", 256, 144, true, true}},
    {13, {"q5_K", 256, 176, true, true}},
    {14, {"q6_K", 256, 210, true, true}},
    {15, {"q8_K", 256, 292, true, false}},
    {16, {"iq2_xxs", 256, 66, true, false}},
    {17, {"iq2_xs", 256, 74, true, false}},
    {18, {"iq3_xxs", 256, 98, true, false}},
    {19, {"iq1_s", 256, 50, true, false}},
    {20, {"iq4_nl", 32, 18, true, true}},
    {21, {"iq3_s", 256, 110, true, false}},
    {22, {"iq2_s", 256, 82, true, false}},
    {23, {"iq4_xs", 256, 136, true, true}},
    {24, {"i8", 1, 1, false, false}},
    {25, {"i16", 1, 2, false, false}},
    {26, {"i32", 1, 4, false, false}},
    {27, {"i64", 1, 8, false, false}},
    {28, {"f64", 1, 8, false, false}},
    {29, {"iq1_m", 256, 56, true, false}},
    {30, {"bf16", 1, 2, false, true}},
    {34, {"tq1_0", 256, 54, true, false}},
    {35, {"tq2_0", 256, 66, true, false}},
    {39, {"mxfp4", 32, 17, true, false}},
};

constexpr uint32_t kMaxId = 40;

const std::array<const DTypeTraits*, kMaxId>& table() {
  static const std::array<const DTypeTraits*, kMaxId> t = [] {
    std::array<const DTypeTraits*, kMaxId> a{};
    for (const Entry& e : kEntries) a[e.id] = &e.traits;
    return a;
  }();
  return t;
}

}  // namespace

const DTypeTraits* dtype_traits_or_null(uint32_t id) { return id < kMaxId ? table()[id] : nullptr; }

const DTypeTraits& dtype_traits(DType type) {
  const DTypeTraits* t = dtype_traits_or_null((uint32_t)type);
  ROOFLINE_CHECK(t != nullptr, "unknown dtype id {}", (uint32_t)type);
  return *t;
}

std::string dtype_name(DType type) {
  std::string s = dtype_traits(type).name;
  for (char& c : s) c = (char)std::toupper((unsigned char)c);
  return s;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const Entry& e : kEntries) {
    std::string_view n = e.traits.name;
    if (n.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < n.size() && same; ++i)
      same = std::tolower((unsigned char)n[i]) == std::tolower((unsigned char)name[i]);
    if (same) return (DType)e.id;
  }
  return std::nullopt;
}

size_t dtype_row_bytes(DType type, int64_t n) {
  const DTypeTraits& t = dtype_traits(type);
  if (n < 0 || n % t.block_size != 0)
    fail("a row of {} elements is not a whole number of {} blocks ({} elements each)", n, dtype_name(type), t.block_size);
  return (size_t)(n / t.block_size) * t.block_bytes;
}

}  // namespace roofline
