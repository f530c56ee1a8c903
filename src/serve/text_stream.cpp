// Incremental output text: UTF-8 completion, stop strings across token boundaries, and the
// reasoning/content split of <think> blocks.
#include "serve/text_stream.h"

#include <algorithm>

namespace roofline::serve {

namespace {

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // continuation byte or invalid lead
}

// Longest k < s.size() with text ending in s[0, k).
size_t partial_suffix(std::string_view text, std::string_view s) {
  const size_t max_k = std::min(text.size(), s.size() - 1);
  for (size_t k = max_k; k > 0; --k)
    if (text.compare(text.size() - k, k, s.substr(0, k)) == 0) return k;
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

void utf8_take_complete(std::string& pending, std::string& out, bool final) {
  size_t i = 0;
  while (i < pending.size()) {
    const unsigned char c = (unsigned char)pending[i];
    const size_t len = utf8_length(c);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (i + len > pending.size()) {
      // Incomplete: keep it unless a byte already seen is not a continuation (then it is invalid).
      bool valid_so_far = true;
      for (size_t j = i + 1; j < pending.size(); ++j)
        if (((unsigned char)pending[j] & 0xC0) != 0x80) valid_so_far = false;
      if (valid_so_far && !final) break;
      out += kReplacement;
      ++i;
      continue;
    }
    bool ok = true;
    for (size_t j = 1; j < len; ++j)
      if (((unsigned char)pending[i + j] & 0xC0) != 0x80) ok = false;
    // Overlong / surrogate / out-of-range second bytes.
    if (ok && len >= 3) {
      const unsigned char c1 = (unsigned char)pending[i + 1];
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) ok = false;
    }
    if (!ok) {
      out += kReplacement;
      ++i;
      continue;
    }
    out.append(pending, i, len);
    i += len;
  }
  pending.erase(0, i);
}

std::string utf8_sanitize(std::string_view text) {
  std::string pending(text), out;
  utf8_take_complete(pending, out, true);
  return out;
}

TextStream::TextStream(std::vector<std::string> stop) {
  for (auto& s : stop)
    if (!s.empty()) stop_.push_back(std::move(s));
}

TextStream::Result TextStream::push(std::string_view bytes) {
  Result r;
  utf8_pending_.append(bytes);
  const size_t before = held_.size();
  utf8_take_complete(utf8_pending_, held_, false);
  if (stop_.empty()) {
    r.text.swap(held_);
    return r;
  }
  // The earliest stop string that now appears (searching only where new text can complete one).
  size_t best = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
    const size_t pos = held_.find(s, from);
    if (pos != std::string::npos && (best == std::string::npos || pos < best || (pos == best && s.size() > r.stop_word.size()))) {
      best = pos;
      r.stop_word = s;
    }
  }
  if (best != std::string::npos) {
    r.text = held_.substr(0, best);
    r.stopped = true;
    held_.clear();
    utf8_pending_.clear();
    return r;
  }
  size_t hold = 0;
  for (const std::string& s : stop_) hold = std::max(hold, partial_suffix(held_, s));
  r.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return r;
}

std::string TextStream::flush() {
  std::string out;
  out.swap(held_);
  utf8_take_complete(utf8_pending_, out, true);
  return out;
}

ReasoningSplitter::ReasoningSplitter(bool start_in_reasoning, std::string open, std::string close)
    : open_(std::move(open)), close_(std::move(close)), state_(start_in_reasoning ? State::ReasoningStart : State::Start) {}

void ReasoningSplitter::run(Out& out, bool final) {
  for (;;) {
    switch (state_) {
      case State::Start: {
        // Leading whitespace, then either the opening tag (reasoning follows) or the answer.
        size_t i = 0;
        while (i < buf_.size() && is_space(buf_[i])) ++i;
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.size() >= open_.size()) {
          if (rest.compare(0, open_.size(), open_) == 0) {
            buf_.erase(0, i + open_.size());
            state_ = State::ReasoningStart;
          } else {
            state_ = State::Content;
          }
          continue;
        }
        if (!final && open_.compare(0, rest.size(), rest) == 0) return;  // could still be the tag
        state_ = State::Content;
        continue;
      }
      case State::ReasoningStart:
      case State::ContentStart: {
        size_t i = 0;
        while (i < buf_.size() && is_space(buf_[i])) ++i;
        if (i == buf_.size() && !final) {
          if (state_ == State::ContentStart) buf_.clear();  // whitespace before the answer is dropped
          return;
        }
        if (state_ == State::ReasoningStart) {
          buf_.erase(0, i);
          state_ = State::Reasoning;
        } else {
          buf_.erase(0, i);
          state_ = State::Content;
        }
        continue;
      }
      case State::Reasoning: {
        const size_t pos = buf_.find(close_);
        if (pos != std::string::npos) {
          out.reasoning += buf_.substr(0, pos);
          buf_.erase(0, pos + close_.size());
          state_ = State::ContentStart;
          continue;
        }
        const size_t hold = final ? 0 : partial_suffix(buf_, close_);
        out.reasoning += buf_.substr(0, buf_.size() - hold);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case State::Content:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

ReasoningSplitter::Out ReasoningSplitter::push(std::string_view text) {
  Out out;
  buf_.append(text);
  run(out, false);
  return out;
}

ReasoningSplitter::Out ReasoningSplitter::flush() {
  Out out;
  run(out, true);
  if (state_ == State::Start || state_ == State::ContentStart) {
    out.content += buf_;
    buf_.clear();
  }
  return out;
}

}  // namespace roofline::serve
