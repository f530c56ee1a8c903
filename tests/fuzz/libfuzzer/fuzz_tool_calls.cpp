// libFuzzer target: model output split into content and tool calls, in each format, whole and streamed
// in pieces (the input's bytes also choose the piece lengths). Never an exception; the streamed result
// must equal the whole one.
#include <cstdint>
#include <set>
#include <string>

#include "serve/tool_calls.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"

using namespace roofline;
using namespace roofline::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::set<std::string> names = {"get_weather", "f", "a b"};
  const ToolCallFormat formats[] = {ToolCallFormat::Hermes, ToolCallFormat::Llama3, ToolCallFormat::GenericJson};
  const ToolCallFormat format = formats[data[0] % 3];
  const size_t piece = 1 + data[0] / 3 % 17;
  try {
    const ToolCallStream::Out whole = parse_tool_calls(text, names, format);
    ToolCallStream s(names, format);
    ToolCallStream::Out streamed;
    auto add = [&](const ToolCallStream::Out& o) {
      streamed.content += o.content;
      streamed.calls.insert(streamed.calls.end(), o.calls.begin(), o.calls.end());
    };
    for (size_t i = 0; i < text.size(); i += piece) add(s.push(text.substr(i, piece)));
    add(s.flush());
    if (streamed.content != whole.content) fuzz::defect("tool_calls", "streamed content differs from the whole parse");
    if (streamed.calls.size() != whole.calls.size()) fuzz::defect("tool_calls", "streamed calls differ from the whole parse");
    for (size_t i = 0; i < whole.calls.size(); ++i)
      if (whole.calls[i].name != streamed.calls[i].name || whole.calls[i].arguments != streamed.calls[i].arguments)
        fuzz::defect("tool_calls", "a streamed call differs from the whole parse");
  } catch (const std::exception& e) {
    fuzz::defect("tool_calls", e.what());
  }
  return 0;
}
