// Output text of one generated choice, built incrementally: bytes in, complete UTF-8 out; stop
// strings matched across token boundaries (text that may begin a stop string is held back until it
// cannot); and the <think>...</think> split of reasoning models into reasoning and content.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace roofline::serve {

// Moves the complete UTF-8 characters at the front of `pending` to `out`; invalid bytes become
// U+FFFD. With `final`, an incomplete tail is flushed as U+FFFD too.
void utf8_take_complete(std::string& pending, std::string& out, bool final);
// `text` with invalid UTF-8 replaced by U+FFFD.
std::string utf8_sanitize(std::string_view text);

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop = {});

  struct Result {
    std::string text;       // text released by this push
    bool stopped = false;   // a stop string matched: `text` ends just before it
    std::string stop_word;  // the stop string that matched
  };
  Result push(std::string_view bytes);
  // The end of the stream (no stop string matched): what is still held back.
  std::string flush();

 private:
  std::vector<std::string> stop_;
  std::string utf8_pending_;
  std::string held_;  // complete text that could still begin a stop string
};

// Splits reasoning ("<think>...</think>") from the answer in streamed text. A stream that starts
// inside the reasoning (the prompt ended with "<think>") passes start_in_reasoning.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool start_in_reasoning = false, std::string open = "<think>", std::string close = "</think>");

  struct Out {
    std::string content;
    std::string reasoning;
  };
  Out push(std::string_view text);
  Out flush();

 private:
  enum class State { Start, ReasoningStart, Reasoning, ContentStart, Content };
  void run(Out& out, bool final);
  std::string open_, close_;
  State state_;
  std::string buf_;
};

}  // namespace roofline::serve
