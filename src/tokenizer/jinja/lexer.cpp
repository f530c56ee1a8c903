// Jinja lexer. Whitespace control follows Jinja2's lexer: lstrip_blocks removes spaces/tabs between
// a line start and a block or comment tag, trim_blocks drops one newline after one, and "-" strips
// all whitespace on its side. String literals are unescaped the way Python's unicode-escape does.
#include "tokenizer/jinja/lexer.h"

#include <cctype>
#include <cstring>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace roofline::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  Lexer(const std::string& src, const LexOptions& opt) : s_(src), opt_(opt) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with "-"
    while (pos <= s_.size()) {
      const size_t tag = find_tag(pos);
      std::string text = s_.substr(pos, (tag == std::string::npos ? s_.size() : tag) - pos);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      }
      strip_next = false;
      if (tag == std::string::npos) {
        emit_text(text, pos);
        break;
      }
      const char kind = s_[tag + 1];  // '{', '%' or '#'
      const char mod = tag + 2 < s_.size() ? s_[tag + 2] : '\0';
      if (mod == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      } else if (kind != '{' && mod != '+' && opt_.lstrip_blocks) {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        const bool line_start = l_pos > 0 || pos == 0 || s_[pos - 1] == '\n';
        if (line_start && l_pos < text.size()) {
          bool ws = true;
          for (size_t k = l_pos; k < text.size(); ++k) ws &= is_space(text[k]);
          if (ws) text.resize(l_pos);
        }
      }
      emit_text(text, pos);
      size_t p = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      line_ = line_at(tag);
      bool strip_after = false, plus_after = false;
      if (kind == '#') {
        const size_t end = s_.find("#}", p);
        if (end == std::string::npos) fail("template line {}: unterminated comment", line_);
        strip_after = end > p && s_[end - 1] == '-';
        p = end + 2;
      } else {
        out_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", line_});
        p = lex_tag(p, kind == '{' ? '}' : '%', &strip_after, &plus_after);
        out_.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", line_});
      }
      if (strip_after) {
        strip_next = true;
      } else if (kind != '{' && !plus_after && opt_.trim_blocks && p < s_.size() && s_[p] == '\n') {
        ++p;
      }
      pos = p;
    }
    out_.push_back({Tok::End, "", line_});
    return std::move(out_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1))
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return std::string::npos;
  }
  int line_at(size_t pos) const {
    int l = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) l += s_[i] == '\n';
    return l;
  }
  void emit_text(const std::string& t, size_t) {
    if (!t.empty()) out_.push_back({Tok::Text, t, line_});
  }

  // Tokenizes the inside of a tag up to its closer ("}}" or "%}"); returns the position after it.
  size_t lex_tag(size_t p, char closer, bool* strip_after, bool* plus_after) {
    std::string open;  // brackets open inside the tag; "}}" closes the tag unless a '{' is open
    while (true) {
      while (p < s_.size() && is_space(s_[p])) {
        if (s_[p] == '\n') ++line_;
        ++p;
      }
      if (p >= s_.size()) fail("template line {}: unterminated tag (missing '{}}}')", line_, closer);
      const char c = s_[p];
      auto at = [&](const char* t) { return s_.compare(p, std::strlen(t), t) == 0; };
      if (open.empty() || open.back() != '{') {
        if (c == closer && p + 1 < s_.size() && s_[p + 1] == '}') return p + 2;
        if ((c == '-' || c == '+') && p + 2 < s_.size() && s_[p + 1] == closer && s_[p + 2] == '}') {
          (c == '-' ? *strip_after : *plus_after) = true;
          return p + 3;
        }
      }
      if (std::isalpha((unsigned char)c) || c == '_') {
        size_t e = p;
        while (e < s_.size() && (std::isalnum((unsigned char)s_[e]) || s_[e] == '_')) ++e;
        out_.push_back({Tok::Name, s_.substr(p, e - p), line_});
        p = e;
      } else if (std::isdigit((unsigned char)c)) {
        size_t e = p;
        while (e < s_.size() && (std::isdigit((unsigned char)s_[e]) || s_[e] == '_')) ++e;
        bool is_float = false;
        if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit((unsigned char)s_[e + 1])) {
          is_float = true;
          ++e;
          while (e < s_.size() && std::isdigit((unsigned char)s_[e])) ++e;
        }
        if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
          size_t k = e + 1;
          if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
          if (k < s_.size() && std::isdigit((unsigned char)s_[k])) {
            is_float = true;
            e = k;
            while (e < s_.size() && std::isdigit((unsigned char)s_[e])) ++e;
          }
        }
        std::string num;
        for (size_t k = p; k < e; ++k)
          if (s_[k] != '_') num += s_[k];
        out_.push_back({is_float ? Tok::Float : Tok::Int, num, line_});
        p = e;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                    "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", ";"};
        const char* found = nullptr;
        for (const char* op : ops)
          if (at(op)) {
            found = op;
            break;
          }
        if (!found) fail("template line {}: unexpected character '{}'", line_, c);
        if (*found == '(' || *found == '[' || *found == '{') open += *found;
        if ((*found == ')' || *found == ']' || *found == '}') && !open.empty()) open.pop_back();
        out_.push_back({Tok::Op, found, line_});
        p += std::strlen(found);
      }
    }
  }

  size_t lex_string(size_t p) {
    const char q = s_[p++];
    std::string v;
    while (true) {
      if (p >= s_.size()) fail("template line {}: unterminated string", line_);
      const char c = s_[p];
      if (c == q) {
        ++p;
        break;
      }
      if (c == '\n') ++line_;
      if (c != '\\' || p + 1 >= s_.size()) {
        v += c;
        ++p;
        continue;
      }
      const char e = s_[p + 1];
      p += 2;
      auto hex = [&](int n) -> uint32_t {
        if (p + n > s_.size()) fail("template line {}: truncated escape in string", line_);
        uint32_t x = 0;
        for (int k = 0; k < n; ++k) {
          const char h = s_[p + k];
          if (!std::isxdigit((unsigned char)h)) fail("template line {}: bad escape in string", line_);
          x = x * 16 + (uint32_t)(std::isdigit((unsigned char)h) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        p += n;
        return x;
      };
      switch (e) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'v': v += '\v'; break;
        case 'a': v += '\a'; break;
        case '0': v += '\0'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case '\n': break;  // line continuation
        case 'x': unicode::append_utf8(v, hex(2)); break;
        case 'u': unicode::append_utf8(v, hex(4)); break;
        case 'U': unicode::append_utf8(v, hex(8)); break;
        default:
          v += '\\';
          v += e;
      }
    }
    out_.push_back({Tok::String, v, line_});
    return p;
  }

  const std::string& s_;
  LexOptions opt_;
  std::vector<Token> out_;
  int line_ = 1;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const LexOptions& options) {
  // Jinja2 drops one trailing newline of the template (keep_trailing_newline=False).
  if (!source.empty() && source.back() == '\n') return Lexer(source.substr(0, source.size() - 1), options).run();
  return Lexer(source, options).run();
}

}  // namespace roofline::jinja
