// How deeply a JSON text nests arrays and objects, measured on the text before it is parsed: parsing is
// iterative, but what walks the parsed value afterwards (dumping, copying into template values, schema
// conversion) recurses once per level, so a request or a model output nested a hundred thousand levels
// deep would overflow the stack. Callers refuse texts past their limit (kMaxJsonNesting) instead.
#pragma once

#include <cstddef>
#include <string_view>

namespace roofline {

// Deep enough for any real request (tool schemas nest a few dozen levels) and shallow enough for every
// recursive walk of ours to stay far inside a thread's stack.
constexpr size_t kMaxJsonNesting = 512;

// The deepest nesting of [ and { outside strings in `text` (0 for a scalar). Malformed text gets a number
// too (the parser then says what is wrong); only the depth is promised.
size_t json_nesting_depth(std::string_view text);

}  // namespace roofline
