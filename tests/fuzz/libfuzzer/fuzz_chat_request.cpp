// libFuzzer target: an HTTP request body as the API layer parses it (/v1/chat/completions, /v1/completions,
// /completion, /tokenize, /detokenize, /apply-template), against the tiny Qwen3-shaped model's tokenizer and
// chat template. The server answers ApiError and roofline::Error with a 400; anything else (a
// nlohmann::json type_error of our own field access, an InternalError, std::out_of_range) would be a 500
// for a client's mistake, so it is a defect here.
#include <cstdint>
#include <memory>
#include <string>

#include "serve/api.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"
#include "tests/serve/tiny_model_context.h"

using namespace roofline;
using namespace roofline::serve;

namespace {

const ModelContext& context() {
  static const std::unique_ptr<ModelContext> mc = [] {
    auto c = std::make_unique<ModelContext>();
    describe_tiny_qwen3(*c);
    c->n_ctx = 512;
    c->n_slots = 2;
    c->thinking_template = true;
    return c;
  }();
  return *mc;
}

template <class F>
void expect_400_or_ok(const char* where, F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    if (e.status >= 500) fuzz::defect(where, e.what());
  } catch (const InternalError& e) {
    fuzz::defect(where, e.what());
  } catch (const Error&) {
  } catch (const std::exception& e) {
    fuzz::defect(where, e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const ModelContext& mc = context();
  const std::string body_text(reinterpret_cast<const char*>(data) + 1, size - 1);
  json body;
  try {
    body = parse_body(body_text);
  } catch (const ApiError&) {
    return 0;
  } catch (const std::exception& e) {
    fuzz::defect("parse_body", e.what());
  }
  switch (data[0] % 6) {
    case 0: expect_400_or_ok("chat", [&] { parse_chat_request(body, mc); }); break;
    case 1: expect_400_or_ok("completions", [&] { parse_completion_request(body, mc, Endpoint::Completions); }); break;
    case 2: expect_400_or_ok("native", [&] { parse_completion_request(body, mc, Endpoint::Native); }); break;
    case 3: expect_400_or_ok("tokenize", [&] { tokenize_body(mc, body); }); break;
    case 4: expect_400_or_ok("detokenize", [&] { detokenize_body(mc, body); }); break;
    default: expect_400_or_ok("apply-template", [&] { apply_template_body(mc, body); }); break;
  }
  return 0;
}
