// Helpers shared by the tokenizer tests: seeded random valid UTF-8 and the tricky strings every
// tokenizer must round-trip.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace cemfrac::test {

// UTF-8 of one code point (no checks: callers pass scalar values).
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// A random scalar value (no surrogates), biased towards what text holds: ASCII letters, digits,
// punctuation and whitespace of every kind GPT-2's pattern distinguishes, apostrophe contractions,
// Latin-1, other BMP scripts, and now and then any plane.
inline uint32_t random_code_point(std::mt19937_64& rng) {
  static const uint32_t kSpaces[] = {' ',    '\t',   '\n',   '\r',   0x0B,   0x0C,   0x85,
                                     0xA0,   0x1680, 0x2000, 0x2007, 0x200A, 0x200B, 0x2028,
                                     0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF, 0x180E};
  static const char kContraction[] = "'sStTmMdDlLvVeErR";
  std::uniform_int_distribution<int> kind(0, 99);
  const int k = kind(rng);
  auto uniform = [&rng](uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };
  if (k < 30) return k % 2 ? uniform('a', 'z') : uniform('A', 'Z');
  if (k < 40) return uniform('0', '9');
  if (k < 55) return kSpaces[uniform(0, sizeof(kSpaces) / sizeof(kSpaces[0]) - 1)];
  if (k < 62) return static_cast<unsigned char>(kContraction[uniform(0, sizeof(kContraction) - 2)]);
  if (k < 72) return uniform('!', '/');
  if (k < 78) return uniform(0x00, 0x7F);
  if (k < 84) return uniform(0x80, 0x2FF);
  if (k < 94) {
    uint32_t cp;
    do cp = uniform(0x300, 0xFFFF);
    while (cp >= 0xD800 && cp <= 0xDFFF);
    return cp;
  }
  if (k < 97) return uniform(0x1F300, 0x1FAFF);  // emoji
  uint32_t cp;
  do cp = uniform(0x80, 0x10FFFF);
  while (cp >= 0xD800 && cp <= 0xDFFF);
  return cp;
}

// A random valid UTF-8 string of 0..max_chars code points.
inline std::string random_utf8(std::mt19937_64& rng, int max_chars) {
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, max_chars)(rng);
  for (int i = 0; i < n; ++i) append_utf8(s, random_code_point(rng));
  return s;
}

// Whitespace and boundary cases every tokenizer must round-trip exactly.
inline std::vector<std::string> tricky_texts() {
  return {
      "",
      " ",
      "  ",
      "\n",
      "\n\n\n",
      " leading space",
      "   three leading spaces",
      "trailing space ",
      "trailing spaces   ",
      "trailing newline\n",
      "two  spaces and   three",
      "tab\tand\t\ttabs\t",
      "\r\nwindows\r\nlines\r\n",
      "mixed \t\n \n\t whitespace \n",
      " \xE2\x80\x83"
      "em space\xE3\x80\x80ideographic\xC2\xA0nbsp\xC2\x85nel\xEF\xBB\xBF bom",
      "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
      "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0"
      "\x9F\x8F\xBD",
      "\xE2\x96\x81 lower one eighth block \xE2\x96\x81\xE2\x96\x81x",
      "<|endoftext|>",
      "It's what they'LL do, 'S 'll",
      std::string("nul\0byte", 8),
      "\x01\x02\x7F control",
  };
}

}  // namespace cemfrac::test
