// Tests' reading of a server-sent event stream: the JSON payload of each "data: " event, [DONE] left out.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace roofline::test {

template <class Json = nlohmann::json>
std::vector<Json> sse_payloads(const std::string& stream) {
  std::vector<Json> out;
  size_t pos = 0;
  while ((pos = stream.find("data: ", pos)) != std::string::npos) {
    const size_t end = stream.find("\n\n", pos);
    const std::string p = stream.substr(pos + 6, end - pos - 6);
    pos = end;
    if (p != "[DONE]") out.push_back(Json::parse(p));
  }
  return out;
}

}  // namespace roofline::test
