// The rows of the architecture table.
#include "model/arch.h"

namespace roofline {

const std::vector<ArchInfo>& supported_archs() {
  static const std::vector<ArchInfo> archs = {
      {"llama", RopeStyle::Norm, true, false, true},
      {"qwen2", RopeStyle::Neox, true, false, false},
      {"qwen3", RopeStyle::Neox, false, true, false},
  };
  return archs;
}

const ArchInfo* find_arch(std::string_view name) {
  for (const ArchInfo& a : supported_archs())
    if (a.name == name) return &a;
  return nullptr;
}

std::string supported_arch_names() {
  std::string s;
  for (const ArchInfo& a : supported_archs()) s += (s.empty() ? "" : ", ") + a.name;
  return s;
}

}  // namespace roofline
