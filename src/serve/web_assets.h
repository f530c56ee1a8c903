// The chat page's files (web/), embedded in the binary at build time by cmake/embed_web_assets.cmake
// (the generated web_assets.cpp), so `roofline serve` serves its page offline with nothing beside it.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace roofline::serve {

struct WebAsset {
  const char* path;          // "/index.html", "/app.js", ...
  const char* content_type;  // "text/html; charset=utf-8", ...
  const unsigned char* data;
  size_t size;
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data), size}; }
};

// Every embedded file.
std::span<const WebAsset> web_assets();

// The asset served at `path` ("/" is /index.html); nullptr when there is none.
inline const WebAsset* find_web_asset(std::string_view path) {
  if (path == "/") path = "/index.html";
  for (const WebAsset& a : web_assets())
    if (path == a.path) return &a;
  return nullptr;
}

}  // namespace roofline::serve
