// UTF-8 decoding/encoding, the GPT-2 byte-level map and NFC normalization (through utf8proc).
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>

namespace roofline::unicode {

size_t valid_utf8_len(std::string_view s, size_t pos) {
  const size_t n = s.size() - pos;
  const auto b = [&](size_t i) { return (uint8_t)s[pos + i]; };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return (n >= 2 && (b(1) & 0xC0) == 0x80) ? 2 : 0;
  if (c < 0xF0) {
    if (n < 3 || (b(1) & 0xC0) != 0x80 || (b(2) & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // surrogates
    return 3;
  }
  if (c < 0xF5) {
    if (n < 4 || (b(1) & 0xC0) != 0x80 || (b(2) & 0xC0) != 0x80 || (b(3) & 0xC0) != 0x80) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

uint32_t decode_utf8(std::string_view s, size_t pos, size_t* len) {
  const size_t l = valid_utf8_len(s, pos);
  const auto b = [&](size_t i) { return (uint32_t)(uint8_t)s[pos + i]; };
  switch (l) {
    case 1: *len = 1; return b(0);
    case 2: *len = 2; return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: *len = 3; return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    case 4: *len = 4; return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    default: *len = 1; return 0xFFFD;
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6));
    out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18));
    out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  }
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t l = valid_utf8_len(s, i);
    if (!l) return false;
    i += l;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t l = valid_utf8_len(s, i);
    if (l) {
      out.append(s.substr(i, l));
      i += l;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Look at the last up-to-3 bytes for the start of a multi-byte sequence that is still incomplete.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t c = (uint8_t)s[n - back];
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead byte
    size_t need = 0;
    if (c >= 0xC2 && c < 0xE0) need = 2;
    else if (c >= 0xE0 && c < 0xF0) need = 3;
    else if (c >= 0xF0 && c < 0xF5) need = 4;
    if (need > back) {
      // Incomplete only if the bytes present so far could still form a valid sequence.
      std::string probe(s.substr(n - back));
      static constexpr char kFill[] = "\xBF\xBF\xBF";
      probe.append(kFill, need - back);
      // A valid completion exists when the present prefix is valid with some continuation bytes;
      // checking with 0x80 and 0xBF endings covers the overlong/surrogate limits of byte 2.
      std::string probe_lo(s.substr(n - back));
      probe_lo.append(need - back, '\x80');
      if (valid_utf8_len(probe, 0) == need || valid_utf8_len(probe_lo, 0) == need) return n - back;
    }
    return n;
  }
  return n;
}

ByteLevelMap::ByteLevelMap() {
  cp_to_byte.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + extra++);
    byte_to_utf8[b].clear();
    append_utf8(byte_to_utf8[b], cp);
    cp_to_byte[cp] = (int16_t)b;
  }
}

std::string ByteLevelMap::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += byte_to_utf8[c];
  return out;
}

bool ByteLevelMap::decode(std::string_view text, std::string& out) const {
  bool ok = true;
  for (size_t i = 0; i < text.size();) {
    size_t len = 0;
    const uint32_t cp = decode_utf8(text, i, &len);
    if (cp < cp_to_byte.size() && cp_to_byte[cp] >= 0 && valid_utf8_len(text, i)) {
      out += (char)cp_to_byte[cp];
    } else {
      out.append(text.substr(i, len));
      ok = false;
    }
    i += len;
  }
  return ok;
}

const ByteLevelMap& byte_level_map() {
  static const ByteLevelMap map;
  return map;
}

namespace {

void nfc_valid(std::string_view run, std::string& out) {
  bool ascii = true;
  for (unsigned char c : run) ascii &= c < 0x80;
  if (ascii) {
    out.append(run);
    return;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map((const utf8proc_uint8_t*)run.data(), (utf8proc_ssize_t)run.size(), &result,
                   (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0 || !result) {
    out.append(run);
  } else {
    out.append((const char*)result, (size_t)n);
  }
  std::free(result);
}

}  // namespace

std::string nfc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t run_start = 0;
  size_t i = 0;
  while (i < s.size()) {
    const size_t l = valid_utf8_len(s, i);
    if (l) {
      i += l;
      continue;
    }
    nfc_valid(s.substr(run_start, i - run_start), out);
    out += s[i];
    ++i;
    run_start = i;
  }
  nfc_valid(s.substr(run_start), out);
  return out;
}

}  // namespace roofline::unicode
